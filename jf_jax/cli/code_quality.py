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
import json
import sys

from jf_jax.cli.evaluate_options import prompt_set_name
from jf_jax.data.build import read_jsonl
from jf_jax.eval.code_quality import CHECKS, code_quality


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
    scores = code_quality(result, args.set or prompt_set_name(args.prompts), read_jsonl(args.prompts),
                          tokenizer.decode)
    print("| model | code prompts | closed python block | parses | defines the function |")
    print("|---|---|---|---|---|")
    for s in scores:
        print(f"| {s.model} | {s.answers} | " + " | ".join(f"{getattr(s, k)}/{s.answers}" for k in CHECKS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
