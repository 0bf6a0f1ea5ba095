"""The bf16 GEMM kernels against XLA's dot on the weights of one decode step, side by side, at 1-16 rows.

One program per (engine, rows) multiplies the rows through every projection of a SmolLM2-135M-shaped model
(30 layers of q, k, v, o, gate, up, down, then the tied output head; random weights, packed once), each product
feeding the next so none is skipped. Engines: ``xla`` (what a CPU without a kernel runs: XLA's dots on each weight
split in column shards, one per core, rows padded to ``DotRows.fewest``, as ``jf_jax.model.weight_matmul.matmul``
does), ``avx2`` and ``avx512`` (the two kernels of ``cpu_kernels.bf16_gemm``, where they run). The engines
take turns, repeat after repeat, so a machine shared with other work slows them alike; the report gives each
median, the weight bytes read per second, and that over the machine's two-thread read bandwidth.

    python experiments/bench_bf16_gemm.py --json results/studies/decode_engine_speed/bf16_gemm_<cpu>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HIDDEN, INTER, KV, VOCAB, LAYERS = 576, 1536, 192, 49152, 30


def model_weights(rng):
    import numpy as np

    from cpu_kernels import pack_weight

    def packed(k, n):
        return pack_weight((rng.standard_normal((k, n)) * k ** -0.5).astype(np.float32))

    shapes = [(HIDDEN, HIDDEN), (HIDDEN, KV), (HIDDEN, KV), (HIDDEN, HIDDEN), (HIDDEN, INTER), (HIDDEN, INTER),
              (INTER, HIDDEN)]
    return [packed(k, n) for _ in range(LAYERS) for k, n in shapes] + [packed(HIDDEN, VOCAB)]


def xla_weights(packed: list) -> list:
    """Each weight as the decode view without kernels holds it: bf16, split in column shards (one per core)."""
    import jax.numpy as jnp

    from cpu_kernels import bf16_gemm
    from jf_jax.api import default_column_shards

    return [tuple(jnp.array_split(bf16_gemm.unpack_weight(p), default_column_shards(), axis=1)) for p in packed]


def step_program(engine: str):
    import jax
    import jax.numpy as jnp

    from cpu_kernels import bf16_gemm
    from jf_jax.model.weight_matmul import mixed_einsum, this_machine_dot_rows

    fewest = this_machine_dot_rows("bfloat16").fewest

    def product(x, w):
        if engine != "xla":
            return bf16_gemm.gemm_kernel(x, w, {k.kernel_set.name: k.target for k in bf16_gemm.KERNELS}[engine])
        rows = x.shape[0]
        x = jnp.pad(x, ((0, max(fewest - rows, 0)), (0, 0)))
        return jnp.concatenate([mixed_einsum("mk,kn->mn", x, s) for s in w], axis=1)[:rows]

    def step(weights, x):
        acts = {HIDDEN: x.astype(jnp.bfloat16), INTER: None}
        total = jnp.zeros(x.shape[0], jnp.float32)  # every product adds to the result, so none is dropped
        for w in weights:
            y = product(acts[in_width(w)], w)
            total = total + y[:, 0]
            if y.shape[1] in acts:  # the hidden and inner activations feed the next products that read them
                acts[y.shape[1]] = y.astype(jnp.bfloat16)
        return total

    return jax.jit(step)


def in_width(w) -> int:
    """A weight's input width, packed or as column shards."""
    return w.k if hasattr(w, "k") else w[0].shape[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from cpu_kernels import library
    from jf_jax.tuning.measure import read_bandwidth_gbs
    from jf_jax.model import machine

    here = machine.detect()
    engines = ["xla"] + [s.name for s in (library.AVX2, library.AVX512) if library.available(s)]
    weights = model_weights(np.random.default_rng(0))
    weight_bytes = sum(p.data.nbytes for p in weights)
    rows = [int(r) for r in args.rows.split(",")]
    programs = {e: step_program(e) for e in engines}
    held = {e: xla_weights(weights) if e == "xla" else weights for e in engines}
    inputs = {m: np.random.default_rng(m).standard_normal((m, HIDDEN)).astype(np.float32) for m in rows}
    for e in engines:
        for m in rows:
            jax.block_until_ready(programs[e](held[e], inputs[m]))  # compile + warm up
    times = {(e, m): [] for e in engines for m in rows}
    for _ in range(args.repeats):
        for m in rows:
            for e in engines:
                start = time.perf_counter()
                jax.block_until_ready(programs[e](held[e], inputs[m]))
                times[e, m].append(time.perf_counter() - start)
    bandwidth = read_bandwidth_gbs()
    results = {e: {m: dict(ms=1e3 * statistics.median(times[e, m]),
                           gb_s=weight_bytes / statistics.median(times[e, m]) / 1e9) for m in rows} for e in engines}
    for e in engines:
        print(f"{e:>6}: " + "  ".join(f"{m} rows {r['ms']:.1f} ms ({r['gb_s']:.1f} GB/s, "
                                      f"{r['gb_s'] / bandwidth:.0%})" for m, r in results[e].items()))
    print(f"weights {weight_bytes / 1e6:.0f} MB per step; two-thread read bandwidth {bandwidth:.1f} GB/s; "
          f"{here.cpu_model}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(
            command="python " + " ".join(sys.argv), cpu=here.cpu_model, cpu_features=here.features(),
            weight_bytes=weight_bytes, read_bandwidth_gbs=bandwidth, repeats=args.repeats, results=results),
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
