"""The decode engine, measured side by side in one run: what parallel tokens cost, and what they buy.

Per dtype (float32, bfloat16, int8):
  1. latency of one cached forward (+ logits + argmax) against the number of tokens t, over a context of
     --context tokens, and its ratio to that dtype's one-token AR step;
  2. AR tokens/s with batch 1 (fixed --tokens, EOS ignored) against the bound of reading every weight once per
     token at the machine's measured read bandwidth;
  3. jacobi and mr against same-dtype AR on prompts that no training set holds (tokens/s, TPF, speedup,
     equal tokens checked), with batch 1, and with batch 4 and 8 (total tokens/s of the batch);
and transformers' ``generate`` on the same weights in float32 and bfloat16 (--transformers).

    python experiments/bench_engine.py --json results/studies/decode_engine_speed/bench_engine.json \
        --markdown results/studies/decode_engine_speed/bench_engine.md
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


def ar_rates(model, encoded, tokens: int) -> list[float]:
    """AR tokens/s of each prompt alone (batch 1), EOS ignored so every prompt makes ``tokens`` tokens."""
    from jf_jax.decoding.ar import generate_ar

    rates = []
    for ids in encoded:
        result = generate_ar(model.params, model.cfg, [ids], max_new_tokens=tokens, eos_ids=[])
        rates.append(len(result.token_ids[0]) / result.seconds)
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


def batched_vs_ar(model, tokens: int, block_size: int) -> dict:
    """Total tokens/s of B prompts decoded together (EOS on), per method, for B in 4 and 8; tokens checked equal
    to batch-1 AR's (the same prompts, repeated to fill the batch)."""
    from jf_jax import api

    prompts = PROMPTS * 2
    alone = [c.token_ids for c in api.generate(model, prompts, method="ar", max_new_tokens=tokens)]
    out = {}
    for batch, methods in ((4, ("ar", "jacobi")), (8, ("ar", "jacobi", "mr"))):
        out[batch] = {}
        for method in methods:
            options = {} if method == "ar" else dict(block_size=block_size)
            if method == "mr":
                options.update(num_blocks=2, pool_size=4)
            done = api.generate(model, prompts[:batch], method=method, max_new_tokens=tokens, batch_size=batch,
                                **options)
            new = sum(c.new_tokens for c in done)
            out[batch][method] = dict(tokens=new, seconds=done[0].seconds, tokens_per_second=new / done[0].seconds,
                                      tokens_per_forward=new / sum(c.forwards for c in done),
                                      equal_to_ar=[c.token_ids for c in done] == alone[:batch])
        base = out[batch]["ar"]["tokens_per_second"]
        for method in methods:
            out[batch][method]["vs_ar"] = out[batch][method]["tokens_per_second"] / base
    return out


def step_weight_bytes(view) -> int:
    """Bytes of weights a one-token step reads in the decode view: every layer, the final norm and the output
    projection (the embedding table when it is tied and unsplit; a step looks up only its token's row)."""
    import jax

    head = view.lm_head if view.lm_head is not None else view.embed
    return sum(x.nbytes for x in jax.tree.leaves((view.layers, view.final_norm, head)))


def bench_dtype(dtype: str, args, bandwidth: float) -> dict:
    from jf_jax import api
    from jf_jax.tuning.measure import measure_latency

    model = api.load_model(args.model, dtype=dtype)
    encoded = api.encode_prompts(model, PROMPTS)
    curve = measure_latency(model.params, model.cfg, SIZES, context=args.context, repeats=args.repeats)
    ms = dict(zip(curve.tokens, (s * 1e3 for s in curve.seconds)))
    weight_bytes = step_weight_bytes(model.params)
    bound = bandwidth * 1e9 / weight_bytes
    batch1 = statistics.median(ar_rates(model, encoded, args.tokens))
    result = dict(latency_ms=ms, latency_ratio={t: ms[t] / ms[1] for t in ms}, weight_bytes=weight_bytes,
                  ar_bound_tokens_per_second=bound, ar_batch1_tokens_per_second=batch1,
                  ar_fraction_of_bound=batch1 / bound,
                  parallel=parallel_vs_ar(model, args.tokens, args.block_size),
                  batched=batched_vs_ar(model, args.tokens, args.block_size))
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
    lines += ["", "| dtype | AR tok/s (batch 1) | bound | % of bound | jacobi tok/s (TPF) |"
              " mr tok/s (TPF) | jacobi / AR | mr / AR | equal tokens |", "|---" * 9 + "|"]
    for d in dtypes:
        r, p = report["dtypes"][d], report["dtypes"][d]["parallel"]
        lines.append(
            f"| {d} | {r['ar_batch1_tokens_per_second']:.1f} | {r['ar_bound_tokens_per_second']:.1f} | "
            f"{100 * r['ar_fraction_of_bound']:.0f}% | {p['jacobi']['tokens_per_second']:.1f} "
            f"({p['jacobi']['tokens_per_forward']:.2f}) | {p['mr']['tokens_per_second']:.1f} "
            f"({p['mr']['tokens_per_forward']:.2f}) | {p['jacobi']['speedup_vs_ar']:.2f} | "
            f"{p['mr']['speedup_vs_ar']:.2f} | {p['jacobi']['equal_to_ar'] and p['mr']['equal_to_ar']} |")
    lines += ["", "Batched decoding (total tok/s of the batch, TPF, ratio to AR at the same batch size, tokens "
              "equal to batch-1 AR):", "", "| dtype | batch | method | tok/s | TPF | vs AR | equal |", "|---" * 7 + "|"]
    for d in dtypes:
        for batch, methods in report["dtypes"][d]["batched"].items():
            for method, m in methods.items():
                lines.append(f"| {d} | {batch} | {method} | {m['tokens_per_second']:.1f} | "
                             f"{m['tokens_per_forward']:.2f} | {m['vs_ar']:.2f} | {m['equal_to_ar']} |")
    if "transformers_tokens_per_second" in report:
        lines += ["", "transformers `generate` (batch 1, same weights): " + ", ".join(
            f"{d} {v:.1f} tok/s" for d, v in report["transformers_tokens_per_second"].items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8")
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
