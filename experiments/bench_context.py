"""AR decode speed after the prefill, by prompt length: how a step's cost grows with the context it attends over.

A step reads the weights (fixed) and the KV cache (growing with the context); this puts numbers on the second
part. Prompts are a sentence repeated ``--repeats`` times (so ``1,20,50,100`` gives ~50 to ~1,700 tokens);
each length is decoded once to compile, then timed three times, and the median is reported (tokens after the
first, over the wall clock minus the prefill's).

    python experiments/bench_context.py [--dtype bfloat16] [--repeats 1,20,50,100] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from jf_jax.cli.tune import positive_ints

SENTENCE = "The quick brown fox jumps over the lazy dog while the cat watches from the window. "


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=positive_ints, default=(1, 20, 50, 100),
                        help="how many times the sentence is repeated in each prompt")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from jf_jax import api
    from jf_jax.model import machine

    model = api.load_model(args.model, dtype=args.dtype)
    rows = []
    for repeats in args.repeats:
        prompt = SENTENCE * repeats + "Summarise the text above."
        prompt_tokens = len(api.encode_prompts(model, [prompt])[0])
        api.generate(model, [prompt], method="ar", max_new_tokens=args.tokens)  # compile
        rates, prefills = [], []
        for _ in range(3):
            (c,) = api.generate(model, [prompt], method="ar", max_new_tokens=args.tokens)
            rates.append((c.new_tokens - 1) / (c.seconds - c.prefill_seconds))
            prefills.append(c.prefill_seconds)
        rows.append(dict(prompt_tokens=prompt_tokens, tokens_per_second=statistics.median(rates),
                         prefill_seconds=statistics.median(prefills)))
        print(f"prompt {prompt_tokens:5d} tokens: AR {rows[-1]['tokens_per_second']:6.1f} tok/s after the prefill "
              f"(prefill {rows[-1]['prefill_seconds']:.2f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            path = machine.engine_path(machine.detect(), args.dtype).summary
            json.dump(dict(command=" ".join(["python"] + sys.argv), model=args.model, dtype=args.dtype,
                           tokens=args.tokens, cpu=machine.cpu_model(), path=path, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
