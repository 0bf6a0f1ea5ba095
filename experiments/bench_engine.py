"""The decode engine, measured side by side in one run: what parallel tokens cost, and what they buy.

Per dtype (float32, bfloat16):
  1. latency of one cached forward (+ logits + argmax) against the number of tokens t, over a context of
     --context tokens, and its ratio to that dtype's one-token AR step;
  2. AR tokens/s with batch 1 (fixed --tokens, EOS ignored) against the bound of reading every weight once per
     token at the machine's measured read bandwidth; AR with batch 4 and 8 (total tokens/s);
  3. jacobi and mr against same-dtype AR on prompts that no training set holds (tokens/s, TPF, speedup,
     equal tokens checked);
and transformers' ``generate`` on the same weights in float32 and bfloat16 (--transformers).

    python experiments/bench_engine.py --json experiments/results/bench_engine.json \
        --markdown experiments/results/bench_engine.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench_ar import bench_hf, read_bandwidth_gbs  # experiments/ is on sys.path when run as a script

PROMPTS = [  # not in any training or tuning set of the repository
    "Write a Python function that merges two sorted lists into one sorted list.",
    "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have?",
    "Give three tips for writing clear commit messages.",
    "Write a Python class for a stack with push, pop and peek.",
]
SIZES = (1, 2, 4, 8, 16, 32, 64)


def ar_rates(model, encoded, tokens: int, batch: int = 1) -> list[float]:
    from jf_jax.decoding.ar import generate_ar

    rates = []
    for i in range(0, len(encoded) - batch + 1, batch):
        result = generate_ar(model.params, model.cfg, encoded[i:i + batch], max_new_tokens=tokens, eos_ids=[])
        rates.append(sum(len(t) for t in result.token_ids) / result.seconds)
    return rates


def parallel_vs_ar(model, tokens: int, block_size: int) -> dict:
    """jacobi and mr against AR (batch 1 each, EOS on): tokens/s, TPF and whether the tokens are equal."""
    from jf_jax import api

    out = {}
    runs = {"ar": {}, "jacobi": dict(block_size=block_size),
            "mr": dict(block_size=block_size, num_blocks=2, pool_size=4)}
    tokens_of = {}
    for method, options in runs.items():
        per_prompt = api.generate(model, PROMPTS, method=method, max_new_tokens=tokens, **options)
        new = sum(c.new_tokens for c in per_prompt)
        seconds = sum(c.seconds for c in per_prompt)
        out[method] = dict(options, tokens=new, seconds=seconds, tokens_per_second=new / seconds,
                           tokens_per_forward=new / sum(c.forwards for c in per_prompt))
        tokens_of[method] = [c.token_ids for c in per_prompt]
    for method in ("jacobi", "mr"):
        out[method]["speedup_vs_ar"] = out[method]["tokens_per_second"] / out["ar"]["tokens_per_second"]
        out[method]["equal_to_ar"] = tokens_of[method] == tokens_of["ar"]
    return out


def bench_dtype(dtype: str, args, bandwidth: float) -> dict:
    from jf_jax import api
    from jf_jax.model.decode_view import stacked_params
    from jf_jax.model.params import param_bytes
    from jf_jax.tuning.measure import measure_latency

    model = api.load_model(args.model, dtype=dtype)
    encoded = api.encode_prompts(model, PROMPTS)
    curve = measure_latency(model.params, model.cfg, SIZES, context=args.context, repeats=args.repeats)
    ms = dict(zip(curve.tokens, (s * 1e3 for s in curve.seconds)))
    weight_bytes = param_bytes(stacked_params(model.params, model.cfg))
    bound = bandwidth * 1e9 / weight_bytes
    batch1 = statistics.median(ar_rates(model, encoded, args.tokens))
    result = dict(latency_ms=ms, latency_ratio={t: ms[t] / ms[1] for t in ms}, weight_bytes=weight_bytes,
                  ar_bound_tokens_per_second=bound, ar_batch1_tokens_per_second=batch1,
                  ar_fraction_of_bound=batch1 / bound,
                  ar_batch_tokens_per_second={b: statistics.median(ar_rates(model, encoded * (b // len(encoded) + 1),
                                                                             args.tokens, b)) for b in (4, 8)},
                  parallel=parallel_vs_ar(model, args.tokens, args.block_size))
    print(f"{dtype}: t=1 {ms[1]:.1f} ms, t=8 x{ms[8] / ms[1]:.2f}, t=16 x{ms[16] / ms[1]:.2f}; AR batch 1 "
          f"{batch1:.1f} tok/s ({100 * batch1 / bound:.0f}% of the bound)", flush=True)
    return result


def markdown(report: dict) -> str:
    dtypes = list(report["dtypes"])
    lines = [f"Machine: {report['machine']}; read bandwidth {report['read_bandwidth_gbs']:.1f} GB/s; context "
             f"{report['context']} tokens; command: `{report['command']}`", "",
             "| tokens t | " + " | ".join(str(t) for t in SIZES) + " |", "|---" * (len(SIZES) + 1) + "|"]
    for d in dtypes:
        r = report["dtypes"][d]
        lines.append(f"| {d} ms | " + " | ".join(f"{r['latency_ms'][t]:.1f}" for t in SIZES) + " |")
        lines.append(f"| {d} / its t=1 | " + " | ".join(f"{r['latency_ratio'][t]:.2f}" for t in SIZES) + " |")
    lines += ["", "| dtype | AR tok/s (batch 1) | bound | % of bound | AR batch 4 | AR batch 8 | jacobi tok/s (TPF) |"
              " mr tok/s (TPF) | jacobi / AR | mr / AR | equal tokens |", "|---" * 11 + "|"]
    for d in dtypes:
        r, p = report["dtypes"][d], report["dtypes"][d]["parallel"]
        lines.append(
            f"| {d} | {r['ar_batch1_tokens_per_second']:.1f} | {r['ar_bound_tokens_per_second']:.1f} | "
            f"{100 * r['ar_fraction_of_bound']:.0f}% | {r['ar_batch_tokens_per_second'][4]:.1f} | "
            f"{r['ar_batch_tokens_per_second'][8]:.1f} | {p['jacobi']['tokens_per_second']:.1f} "
            f"({p['jacobi']['tokens_per_forward']:.2f}) | {p['mr']['tokens_per_second']:.1f} "
            f"({p['mr']['tokens_per_forward']:.2f}) | {p['jacobi']['speedup_vs_ar']:.2f} | "
            f"{p['mr']['speedup_vs_ar']:.2f} | {p['jacobi']['equal_to_ar'] and p['mr']['equal_to_ar']} |")
    if "transformers_tokens_per_second" in report:
        lines += ["", "transformers `generate` (batch 1, same weights): " + ", ".join(
            f"{d} {v:.1f} tok/s" for d, v in report["transformers_tokens_per_second"].items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--context", type=int, default=256, help="committed tokens under the latency curve")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--transformers", action="store_true", help="also time transformers' generate")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)

    import platform

    bandwidth = read_bandwidth_gbs(threads=2)
    report = dict(machine=f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores",
                  read_bandwidth_gbs=bandwidth, context=args.context, tokens=args.tokens,
                  command="python experiments/bench_engine.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  started=time.strftime("%Y-%m-%d %H:%M:%S"), dtypes={})
    for dtype in args.dtypes.split(","):
        report["dtypes"][dtype] = bench_dtype(dtype, args, bandwidth)
    if args.transformers:
        import torch

        from jf_jax import api
        from jf_jax.weights.hf_reference import transformers_model_from_gguf

        torch.set_num_threads(2)
        model = api.load_model(args.model)
        encoded = api.encode_prompts(model, PROMPTS)
        hf = transformers_model_from_gguf(model.source, model.cfg.num_layers)
        report["transformers_tokens_per_second"] = {
            "float32": statistics.median(bench_hf(hf, encoded, args.tokens)),
            "bfloat16": statistics.median(bench_hf(hf.to(torch.bfloat16), encoded, args.tokens))}
    text = markdown(report)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
