"""CPU kernels for jf-jax's decode steps, each beside a plain-JAX reference with the same semantics.

``bf16_gemm``: a small-M bfloat16 GEMM (XLA FFI custom call, AVX512-BF16) over weights packed once at load
time. This package imports nothing from ``jf_jax``; the model reaches it through ``model.decode_view``.
"""

from cpu_kernels.bf16_gemm import PackedWeight, available, gemm, gemm_reference, pack_weight, unavailable_reason

__all__ = ["PackedWeight", "available", "gemm", "gemm_reference", "pack_weight", "unavailable_reason"]
