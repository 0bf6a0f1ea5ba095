"""CPU kernels for jf-jax's decode steps (XLA FFI custom calls), each beside plain-JAX code with its semantics.

* ``bf16_gemm``: a small-M bfloat16 GEMM over weights packed once at load time (twin: ``gemm_reference``);
* ``decode_attention``: a step's attention over the KV cache (twin: ``jf_jax.model.cached_attention``).

``library`` builds nothing: ``python -m cpu_kernels.build`` compiles them (scripts/install.sh runs it), and
``available()`` says whether they run here. This package imports nothing from ``jf_jax``.
"""

from cpu_kernels.bf16_gemm import PackedWeight, gemm, gemm_reference, pack_weight
from cpu_kernels.decode_attention import decode_attention, supports as attention_supports
from cpu_kernels.library import available, unavailable_reason

__all__ = ["PackedWeight", "attention_supports", "available", "decode_attention", "gemm", "gemm_reference",
           "pack_weight", "unavailable_reason"]
