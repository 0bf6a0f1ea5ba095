"""A weight gradient's dot on XLA:CPU, in the two forms that compute it: 2-D operands ("nd,nv->vd") and the same
operands with a unit leading axis ("znd,znv->vd"), which ``mixed_einsum``'s backward now uses for 2-D inputs.

XLA:CPU runs the 2-D form as a float32 dot of converted operands, the 3-D form as a bf16 transpose and a YNNPACK
dot (the compiled HLO shows it; ``tests/test_mixed_precision.py`` checks it). Both run in one process,
alternately, on the same operands:

    python experiments/bench_weight_grad.py                          # the tied LM head at batch 4 x 320 tokens
    python experiments/bench_weight_grad.py --rows 1280 --out 1536 --inner 576    # an MLP projection
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1280, help="tokens contracted over (n)")
    parser.add_argument("--out", type=int, default=49152, help="the gradient's first axis (v: the vocabulary)")
    parser.add_argument("--inner", type=int, default=576, help="the gradient's second axis (d: hidden size)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if min(args.rows, args.out, args.inner, args.repeats) < 1:
        parser.error("--rows, --out, --inner and --repeats must be positive")

    import jax
    import jax.numpy as jnp

    f32, bf16 = jnp.float32, jnp.bfloat16
    kx, kg = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (args.rows, args.inner), bf16)
    g = jax.random.normal(kg, (args.rows, args.out), bf16)  # the cotangent, cast to bf16 as mixed_einsum does
    forms = {
        "2-D  nd,nv->vd": jax.jit(lambda x, g: jnp.einsum("nd,nv->vd", x, g, preferred_element_type=f32)),
        "3-D znd,znv->vd": jax.jit(lambda x, g: jnp.einsum("znd,znv->vd", x[None], g[None],
                                                           preferred_element_type=f32)),
    }
    results = {name: jax.block_until_ready(f(x, g)) for name, f in forms.items()}
    diff = float(jnp.max(jnp.abs(results["2-D  nd,nv->vd"] - results["3-D znd,znv->vd"])))
    seconds = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, f in forms.items():
            start = time.perf_counter()
            jax.block_until_ready(f(x, g))
            seconds[name].append(time.perf_counter() - start)
    flops = 2 * args.rows * args.out * args.inner
    print(f"weight gradient [{args.out}, {args.inner}] over {args.rows} rows, bf16 operands, float32 accumulation; "
          f"max |difference| between the forms {diff:.2g} (summation order)")
    for name, ts in seconds.items():
        median = statistics.median(ts)
        print(f"  {name}: median {1e3 * median:.0f} ms ({flops / median / 1e9:.0f} GFLOP/s) over {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
