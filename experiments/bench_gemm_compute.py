"""The arithmetic rate of the bf16 GEMM kernel that runs here, with no memory stream: a 576 x 1536 weight (1.8 MB,
held in cache) multiplied by 1-16 rows, 50 products per compiled program, medians of 20 programs. Beside the
machine's FMA peak (``experiments/fma_peak.c``: gcc -O2 -mavx2 -mfma -pthread experiments/fma_peak.c -o /tmp/fma &&
/tmp/fma, which also gives the rate by the number of accumulator chains), it says how far the kernel's multi-row
products are from what the machine's FMAs allow.

    python experiments/bench_gemm_compute.py [--rows 1,4,8,16] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import numpy as np

from jf_jax.cli.tune import positive_ints


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=positive_ints, default=(1, 4, 8, 16), help="row counts, e.g. 1,4,8,16")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import jax
    import jax.numpy as jnp

    import cpu_kernels
    from cpu_kernels.bf16_gemm import gemm_kernel, kernel_target

    target = kernel_target()
    if target is None:
        print("error: no bf16 GEMM kernel runs on this machine (python -m jf_jax.doctor says why)", file=sys.stderr)
        return 2
    K, N, products, programs = 576, 1536, 50, 20
    weight = cpu_kernels.pack_weight(np.random.default_rng(0).standard_normal((K, N)).astype(np.float32))
    kernel = functools.partial(gemm_kernel, target=target)

    @jax.jit
    def many(x, w):
        out = 0.0
        for i in range(products):  # distinct inputs, so no product is shared
            out = out + kernel(x * (1 + i * 1e-3), w)[0, 0]
        return out

    results = {}
    for M in args.rows:
        x = jnp.asarray(np.random.default_rng(1).standard_normal((M, K)), jnp.float32)
        jax.block_until_ready(many(x, weight))
        times = []
        for _ in range(programs):
            start = time.perf_counter()
            jax.block_until_ready(many(x, weight))
            times.append(time.perf_counter() - start)
        seconds = float(np.median(times)) / products
        results[M] = {"us": seconds * 1e6, "g_fma8_per_s": M * K * N / 8 / seconds / 1e9}
        print(f"{target}: {M} rows {seconds * 1e6:.1f} us, {results[M]['g_fma8_per_s']:.2f} G 8-lane FMAs/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python experiments/bench_gemm_compute.py " + " ".join(argv or sys.argv[1:]),
                       "target": target, "K": K, "N": N, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
