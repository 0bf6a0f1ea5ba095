"""A second quality check of greedy AR answers, read from an python -m jf_jax.evaluate result (no decoding).

    python -m jf_jax.cli.code_quality results/smollm2_jf/eval.json \\
        --prompts runs/prompts/code_heldout.jsonl

For every model of the result and every prompt of the code set (the held-out "write this function" tasks), the
AR answer is checked for: a closed ```python block, that the block parses (``ast.parse``) and that it defines
the requested function (``def NAME``). A 135M model scores near zero on GSM8K, so this is where a fine-tune
that damages the model would show first. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys

from jf_jax.data.build import read_jsonl

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def check_answer(text: str, name: str) -> dict:
    blocks = FENCE.findall(text)
    parses = False
    defines = False
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        parses = True
        defines = defines or any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                                 for n in ast.walk(tree))
    return dict(closed_block=bool(blocks), parses=parses, defines=defines)


def function_name(prompt: str) -> str:
    match = re.search(r"function `([A-Za-z_][A-Za-z0-9_]*)\(", prompt)
    return match.group(1) if match else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", help="OUT.json of python -m jf_jax.evaluate")
    p.add_argument("--prompts", required=True, help="the code JSONL the result was measured on")
    p.add_argument("--set", default=None, help="prompt-set name in the result (default: the file's stem)")
    p.add_argument("--tokenizer", default="smollm2-135m", help="weights spec whose tokenizer decodes the answers")
    args = p.parse_args(argv)
    from jf_jax import weights

    tokenizer = weights.load(args.tokenizer).tokenizer

    with open(args.result) as f:
        result = json.load(f)
    set_name = args.set or args.prompts.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    rows = read_jsonl(args.prompts)
    print("| model | code prompts | closed python block | parses | defines the function |")
    print("|---|---|---|---|---|")
    for res in result["results"]:
        ar = res["speed"][set_name]["ar"]
        checks = [check_answer(tokenizer.decode(ids), function_name(row["prompt"]))
                  for ids, row in zip(ar["token_ids"], rows)]
        n = len(checks)
        counts = [sum(c[k] for c in checks) for k in ("closed_block", "parses", "defines")]
        print(f"| {res['model']} | {n} | " + " | ".join(f"{c}/{n}" for c in counts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
