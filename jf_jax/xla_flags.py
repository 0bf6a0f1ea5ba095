"""The XLA setting jf-jax's lossless decoding rests on, applied before JAX starts its CPU backend.

Greedy Jacobi / multi-block decoding equals AR decoding only if a token's logits have the same bits however
many tokens share its forward. XLA:CPU's dots have that property for any number of rows >= 2, but by default
XLA:CPU also hands some *reductions* (the sums of RMSNorm and softmax) to YNNPACK, and only when the arrays are
large enough: a 16-token block then sums in another order than a 1-token step, and bfloat16 argmaxes drift
apart (measured: logits off by up to 1.9 on SmolLM2). Restricting YNNPACK to individual dots keeps every
reduction in XLA's own per-row code; dots still run in YNNPACK (its bf16 and int8 kernels are the fast path).

``import jf_jax`` applies this by appending to ``XLA_FLAGS`` (a user's own setting of the same flag is kept).
If JAX's backend already started, the flag cannot take effect any more and a warning says so.
"""

from __future__ import annotations

import os
import sys
import warnings

YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
BATCH_INVARIANT = f"{YNN_FLAG}=individual_dot"


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def apply() -> bool:
    """Adds ``BATCH_INVARIANT`` to ``XLA_FLAGS`` unless the flag is already set; returns whether it is in force."""
    flags = os.environ.get("XLA_FLAGS", "")
    if YNN_FLAG in flags:
        return BATCH_INVARIANT in flags.split()
    if _backend_started():
        warnings.warn(f"JAX started before jf_jax was imported, so {BATCH_INVARIANT} could not be set: decoding "
                      "still works, but jacobi/mr may differ from AR in bfloat16/int8. Import jf_jax first or set "
                      "the flag in XLA_FLAGS.", RuntimeWarning, stacklevel=3)
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {BATCH_INVARIANT}".strip()
    return True
