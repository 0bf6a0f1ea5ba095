"""jf-jax compiled AR decoding vs Hugging Face transformers' ``generate``, side by side in one run.

Same weights (the GGUF dequantized to float32 by each library's own reader), same dtype, same chat prompts,
same number of new tokens (EOS is ignored so every run produces exactly --tokens), one prompt at a time,
after a warm-up. Also measures the machine's memory read bandwidth and the AR bound it implies
(bytes of weights read per token / bandwidth), and writes everything as JSON.

    python experiments/bench_ar.py --tokens 128 --json results/studies/decode_engine_speed/bench_ar.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from jf_jax.benchmarks.transformers_speed import transformers_rates
from jf_jax.tuning.measure import read_bandwidth_gbs

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
    "Explain in two sentences why the sky is blue.",
]


def bench_jf(model, encoded, tokens: int) -> list[float]:
    from jf_jax.decoding.ar import generate_ar

    rates = []
    for ids in encoded:
        result = generate_ar(model.params, model.cfg, [ids], max_new_tokens=tokens, eos_ids=[])
        assert result.new_tokens == [tokens]
        rates.append(tokens / result.seconds)
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m or a .gguf file")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the machine's cores)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import torch

    from jf_jax import api
    from jf_jax.model.decode_view import stacked_params
    from jf_jax.model.params import param_bytes
    from jf_jax.weights.hf_reference import transformers_model_from_gguf

    torch.set_num_threads(args.threads)
    model = api.load_model(args.model)
    encoded = api.encode_prompts(model, PROMPTS)
    hf_model = transformers_model_from_gguf(model.source, model.cfg.num_layers)

    bandwidth = read_bandwidth_gbs(threads=args.threads)
    # Bytes streamed per token: every weight once, in the declared layout (the decode view's transposed copy
    # of a tied embedding replaces the embedding in the matmul; the embedding itself is only gathered).
    weight_bytes = param_bytes(stacked_params(model.params, model.cfg))
    bound = bandwidth * 1e9 / weight_bytes
    jf = bench_jf(model, encoded, args.tokens)
    hf = transformers_rates(hf_model, encoded, args.tokens)
    jf_med, hf_med = statistics.median(jf), statistics.median(hf)
    report = {
        "model": model.name, "tokens": args.tokens, "prompts": len(PROMPTS), "threads": args.threads,
        "read_bandwidth_gbs": bandwidth, "weight_bytes": weight_bytes, "bound_tokens_per_second": bound,
        "jf_jax_tokens_per_second": jf, "transformers_tokens_per_second": hf,
        "jf_jax_median": jf_med, "transformers_median": hf_med,
        "ratio_jf_over_transformers": jf_med / hf_med, "jf_fraction_of_bound": jf_med / bound,
    }
    print(f"read bandwidth {bandwidth:.1f} GB/s, weights {weight_bytes / 1e6:.0f} MB -> AR bound {bound:.1f} tok/s")
    print(f"{'system':<14} {'median tok/s':>12}   per prompt (prefill included)")
    print(f"{'jf-jax AR':<14} {jf_med:>12.1f}   {', '.join(f'{r:.1f}' for r in jf)}")
    print(f"{'transformers':<14} {hf_med:>12.1f}   {', '.join(f'{r:.1f}' for r in hf)}")
    print(f"jf-jax / transformers = {jf_med / hf_med:.2f}x; jf-jax at {100 * jf_med / bound:.0f}% of the bound")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
