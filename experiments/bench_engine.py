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

from jf_jax.benchmarks.transformers_speed import transformers_rates
from jf_jax.tuning.measure import read_bandwidth_gbs, step_weight_bytes

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
        rates.append(result.stats["total"]["tokens_per_second"])
    return rates


def method_options(method: str, block_size: int) -> dict:
    return {"ar": {}, "jacobi": dict(block_size=block_size),
            "mr": dict(block_size=block_size, num_blocks=2, pool_size=4)}[method]


def run_summaries(completions: dict[str, list], reference: list[list[int]]) -> dict:
    """Per method, ``decoding.stats.summarize`` of its completions' statistics (prompts decoded together share
    their call's seconds), ``speedup_vs_ar`` and ``match_ar`` against ``reference`` (AR's tokens)."""
    from jf_jax.decoding import stats

    out = {}
    for method, done in completions.items():
        shared = {} if done[0].batch_size == 1 else dict(seconds=done[0].seconds,
                                                           prefill_seconds=done[0].prefill_seconds)
        out[method] = dict(stats.summarize([c.stats for c in done], **shared),
                           match_ar=stats.match_fraction([c.token_ids for c in done], reference))
    return stats.add_speedups(out)


def parallel_vs_ar(model, tokens: int, block_size: int) -> dict:
    """jacobi and mr against AR (batch 1 each, EOS on): tokens/s, TPF and whether the tokens are equal."""
    from jf_jax import api

    done = {method: api.generate(model, PROMPTS, method=method, max_new_tokens=tokens,
                                 **method_options(method, block_size)) for method in ("ar", "jacobi", "mr")}
    out = run_summaries(done, [c.token_ids for c in done["ar"]])
    return {method: dict(method_options(method, block_size), **summary) for method, summary in out.items()}


def batched_vs_ar(model, tokens: int, block_size: int) -> dict:
    """Total tokens/s of B prompts decoded together (EOS on), per method, for B in 4 and 8; tokens checked equal
    to batch-1 AR's (the same prompts, repeated to fill the batch); speedup against AR at the same batch size."""
    from jf_jax import api

    prompts = PROMPTS * 2
    alone = [c.token_ids for c in api.generate(model, prompts, method="ar", max_new_tokens=tokens)]
    out = {}
    for batch, methods in ((4, ("ar", "jacobi")), (8, ("ar", "jacobi", "mr"))):
        done = {method: api.generate(model, prompts[:batch], method=method, max_new_tokens=tokens, batch_size=batch,
                                     **method_options(method, block_size)) for method in methods}
        out[batch] = run_summaries(done, alone[:batch])
    return out


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
    """The report's tables; the decoding statistics under ``decoding.stats``' keys (``eval.stats_table``)."""
    from jf_jax.eval.stats_table import Column, render_table

    dtypes = list(report["dtypes"])
    lines = [f"Machine: {report['machine']}; read bandwidth {report['read_bandwidth_gbs']:.1f} GB/s; context "
             f"{report['context']} tokens; command: `{report['command']}`", "",
             "| tokens t | " + " | ".join(str(t) for t in SIZES) + " |", "|---" * (len(SIZES) + 1) + "|"]
    for d in dtypes:
        r = report["dtypes"][d]
        lines.append(f"| {d} ms | " + " | ".join(f"{r['latency_ms'][t]:.1f}" for t in SIZES) + " |")
        lines.append(f"| {d} / its t=1 | " + " | ".join(f"{r['latency_ratio'][t]:.2f}" for t in SIZES) + " |")
    bound = [Column("ar_batch1_tokens_per_second", "AR tok/s (batch 1, median)", ".1f"),
             Column("ar_bound_tokens_per_second", "bound", ".1f"), Column("ar_fraction_of_bound", "of bound", ".0%")]
    lines += ["", render_table([dict(report["dtypes"][d], dtype=d) for d in dtypes], ["dtype", *bound])]
    speed = ["tokens_per_second", "tpf", "speedup_vs_ar", "match_ar"]
    lines += ["", "Batch 1, prompt by prompt (tok/s over the summed seconds; = AR: share of answers equal to AR's):",
              "", render_table([dict(m, dtype=d, method=method) for d in dtypes
                                for method, m in report["dtypes"][d]["parallel"].items()], ["dtype", "method", *speed])]
    lines += ["", "Batched decoding (total tok/s of the batch, TPF, x AR at the same batch size, share of answers "
              "equal to batch-1 AR's):", "",
              render_table([dict(m, dtype=d, batch=batch, method=method) for d in dtypes
                            for batch, methods in report["dtypes"][d]["batched"].items()
                            for method, m in methods.items()], ["dtype", "batch", "method", *speed])]
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
            "float32": statistics.median(transformers_rates(hf, encoded, args.tokens)),
            "bfloat16": statistics.median(transformers_rates(hf.to(torch.bfloat16), encoded, args.tokens))}
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
