"""Check an exported Hugging Face directory against the jf-jax model it came from: transformers loads it on its own
(``AutoModelForCausalLM`` / ``AutoTokenizer``, float32) and its logits, greedy tokens and chat-templated prompts
are compared with jf-jax's.

    python -m jf_jax.cli.export runs/smollm2_jf_n16 exports/smollm2_jf_n16
    python experiments/check_export.py runs/smollm2_jf_n16 exports/smollm2_jf_n16 \\
        --json results/smollm2_jf_n16/export_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "A train travels 60 km in 45 minutes. What is its average speed in km/h?",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="the jf-jax model spec that was exported (e.g. a RUN_DIR)")
    p.add_argument("export", help="the exported Hugging Face directory")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    import numpy as np
    import torch
    import transformers

    from jf_jax import api, weights
    from jf_jax.model.transformer import forward_logits

    ours = weights.load(args.model, dtype="float32")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(args.export, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(args.export)
    rows = []
    model = api.load_model(args.model, dtype="float32")
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        text = ours.tokenizer.apply_chat_template(messages)
        ids = ours.tokenizer.encode(text)
        hf_text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        jf_logits = np.asarray(forward_logits(ours.params, ours.cfg, np.asarray([ids]))[0][0])
        with torch.no_grad():
            hf_logits = hf_model(torch.tensor([ids])).logits[0].numpy()
            hf_out = hf_model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                       attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        hf_tokens = hf_out[0, len(ids):].tolist()
        (jf,) = api.generate(model, [prompt], method="ar", max_new_tokens=args.max_new_tokens)
        n = min(len(hf_tokens), len(jf.token_ids))
        rows.append(dict(prompt=prompt, tokens=len(ids), chat_template_equal=hf_text == text,
                         tokenizer_equal=hf_tok(text, add_special_tokens=False)["input_ids"] == ids,
                         max_abs_logit_diff=float(np.abs(jf_logits - hf_logits).max()),
                         logit_std=float(hf_logits.std()),
                         argmax_equal=bool((jf_logits.argmax(-1) == hf_logits.argmax(-1)).all()),
                         greedy_equal=hf_tokens[:n] == jf.token_ids[:n], greedy_tokens=n))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "prompt"}), flush=True)
    report = dict(command="python experiments/check_export.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  transformers=transformers.__version__, rows=rows,
                  max_abs_logit_diff=max(r["max_abs_logit_diff"] for r in rows),
                  all_greedy_equal=all(r["greedy_equal"] for r in rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if report["all_greedy_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
