"""``decode_jit``: ``jax.jit`` for decode programs, with the compiler settings lossless decoding rests on.

Greedy Jacobi / multi-block decoding equals AR decoding only if a token's logits have the same bits however
many tokens share its forward. Two backend defaults break that, and both are fixed here per compiled program,
so nothing depends on the process environment or on whether JAX started before ``jf_jax`` was imported:

* XLA:CPU hands some *reductions* (the sums of RMSNorm and softmax) to YNNPACK when the arrays are large enough:
  a 16-token block then sums in another order than a one-token step, and bfloat16 argmaxes drift apart (logits
  off by up to 1.9 on SmolLM2). The program option ``xla_cpu_experimental_ynn_fusion_type`` restricted to
  individual dots keeps every reduction in XLA's own per-row loops; dots still run in YNNPACK (its bf16 kernels
  are the fast path).
* On GPUs and TPUs JAX's default float32 matmul precision is reduced (TF32 / bf16 passes): decode programs
  trace under full float32 precision, so a float32 model decodes in float32. (bfloat16 dots are unaffected.)

Programs are compiled per backend on first call (the options are backend-specific and must not start a
backend at import time). The returned callable takes what the jitted function takes and works as a method;
its ``program()`` is the ``jax.jit`` object of the default backend (``program().lower(...)``, cache sizes).
"""

from __future__ import annotations

import functools

import jax

YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"
COMPILER_OPTIONS = {"cpu": {YNN_OPTION: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}}
"""Per-backend XLA compiler options of every decode program."""
FULL_PRECISION_BACKENDS = ("gpu", "tpu", "cuda", "rocm")
"""Backends whose default float32 matmul precision is reduced; decode programs ask for float32 there."""


def decode_jit(fun=None, **jit_kwargs):
    """``jax.jit(fun, **jit_kwargs)`` compiled with ``COMPILER_OPTIONS`` of the default backend (and full float32
    matmul precision on ``FULL_PRECISION_BACKENDS``). Usable as ``@decode_jit`` or ``@decode_jit(static_...=...)``."""
    if fun is None:
        return functools.partial(decode_jit, **jit_kwargs)
    programs = {}

    def for_backend(backend: str, nested: bool = False):
        key = (backend, nested)
        if key not in programs:
            body = fun
            if backend in FULL_PRECISION_BACKENDS:
                @functools.wraps(fun)
                def body(*args, **kwargs):
                    with jax.default_matmul_precision("float32"):
                        return fun(*args, **kwargs)
            # Called while another program is traced, JAX takes no compiler options (only the top level's apply),
            # but the precision is part of the traced dots, so a decode program inside a user's jit keeps it.
            options = None if nested else COMPILER_OPTIONS.get(backend)
            programs[key] = jax.jit(body, compiler_options=options, **jit_kwargs)
        return programs[key]

    @functools.wraps(fun)
    def run(*args, **kwargs):
        nested = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
        return for_backend(jax.default_backend(), nested)(*args, **kwargs)

    run.program = lambda: for_backend(jax.default_backend())
    return run
