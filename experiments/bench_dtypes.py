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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from jf_jax import api
    from jf_jax.decoding.ar import generate_ar
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
    report = {
        "command": " ".join(["python", "experiments/bench_dtypes.py", *(argv or sys.argv[1:])]),
        "machine": {"cpu_model": here.cpu_model, "cores": here.cores, "backend": here.backend,
                    "features": here.features(), "kernels": "run" if here.kernels_run else
                    here.kernels_machine_reason or here.kernels_library_problem,
                    "load_average_at_end": os.getloadavg()},
        "model": args.model, "tokens": args.tokens, "repeats": args.repeats,
        "paths": {d: machine.engine_path(here, d).summary for d in dtypes},
        "tokens_per_second": {d: rates[d] for d in dtypes},
        "cpu_ms_per_token": {d: cpu_ms[d] for d in dtypes},
        "median_tokens_per_second": {d: statistics.median(rates[d]) for d in dtypes},
        "median_cpu_ms_per_token": {d: statistics.median(cpu_ms[d]) for d in dtypes},
    }
    print(json.dumps({k: report[k] for k in ("median_tokens_per_second", "median_cpu_ms_per_token")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
