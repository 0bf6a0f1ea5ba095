"""AR decode speed of each dtype on this machine, interleaved, in wall clock and in CPU time per token.

The evidence behind ``--dtype auto``'s order of dtypes on a CPU (``jf_jax.model.machine.fastest_first``). The
dtypes take turns, repeat after repeat, so a machine shared with other work slows each of them alike; the CPU
time this process spends per token is reported beside tokens/s because, on a machine whose cores are contended,
it moves less with the load than the wall clock does. EOS is ignored, so every run makes exactly --tokens tokens.

    python experiments/bench_dtypes.py --json results/studies/decode_engine_speed/dtypes_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", default="1,2,4,8,16",
                        help="token counts t of the cached-forward latency curve per dtype (empty: none)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from cpu_kernels import library
    from jf_jax import api
    from jf_jax.decoding.ar import generate_ar
    from jf_jax.tuning.measure import measure_latency, read_bandwidth_gbs, step_weight_bytes
    from jf_jax.model import machine

    here = machine.detect()
    dtypes = args.dtypes.split(",")
    models = {d: api.load_model(args.model, dtype=d) for d in dtypes}
    encoded = api.encode_prompts(models[dtypes[0]], [PROMPT])
    rates, cpu_ms = {d: [] for d in dtypes}, {d: [] for d in dtypes}
    for repeat in range(args.repeats + 1):  # the first round compiles and is not counted
        for d in dtypes:
            started = time.process_time()
            result = generate_ar(models[d].params, models[d].cfg, encoded, max_new_tokens=args.tokens, eos_ids=[],
                                 warmup=False)
            spent = time.process_time() - started
            if repeat:
                rates[d].append(args.tokens / (result.seconds - result.prefill_seconds))
                cpu_ms[d].append(1000 * spent / args.tokens)
                print(f"{d:9} repeat {repeat}: {rates[d][-1]:6.1f} tok/s, {cpu_ms[d][-1]:6.1f} CPU ms/token",
                      file=sys.stderr)
    sizes = [int(t) for t in args.latency.split(",") if t]
    latency_ms = {}
    for d in dtypes if sizes else ():  # context 256, median of 9, one program per t (compiled first)
        curve = measure_latency(models[d].params, models[d].cfg, sizes, context=256, repeats=9)
        latency_ms[d] = {t: 1e3 * s for t, s in zip(curve.tokens, curve.seconds)}
        print(f"{d:9} ms per forward: " + ", ".join(f"t={t} {ms:.1f}" for t, ms in latency_ms[d].items()),
              file=sys.stderr)
    bandwidth = read_bandwidth_gbs()
    bounds = {d: bandwidth * 1e9 / step_weight_bytes(models[d].params) for d in dtypes}
    report = {
        "command": " ".join(["python", "experiments/bench_dtypes.py", *(argv or sys.argv[1:])]),
        "machine": {"cpu_model": here.cpu_model, "cores": here.cores, "backend": here.backend,
                    "features": here.features(), "kernels": "run" if here.avx512_kernels_run else
                    here.avx512_machine_reason or here.avx512_library_problem,
                    "avx2_gemm": "run" if here.avx2_gemm_runs else
                    here.avx2_machine_reason or here.avx2_library_problem,
                    "kernel_sets_allowed": list(library.chosen_sets()), "read_bandwidth_gbs": bandwidth,
                    "load_average_at_end": os.getloadavg()},
        "model": args.model, "tokens": args.tokens, "repeats": args.repeats,
        "paths": {d: machine.engine_path(here, d).summary for d in dtypes},
        "tokens_per_second": {d: rates[d] for d in dtypes},
        "cpu_ms_per_token": {d: cpu_ms[d] for d in dtypes},
        "median_tokens_per_second": {d: statistics.median(rates[d]) for d in dtypes},
        "median_cpu_ms_per_token": {d: statistics.median(cpu_ms[d]) for d in dtypes},
        "bound_tokens_per_second": bounds,
        "fraction_of_bound": {d: statistics.median(rates[d]) / bounds[d] for d in dtypes},
        "latency_ms": latency_ms,
        "latency_over_one_token": {d: {t: ms / c[sizes[0]] for t, ms in c.items()} for d, c in latency_ms.items()},
    }
    print(json.dumps({k: report[k] for k in ("paths", "median_tokens_per_second", "median_cpu_ms_per_token",
                                             "fraction_of_bound", "latency_over_one_token")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
