"""CPU kernels for jf-jax's decode steps (XLA FFI custom calls), each beside plain-JAX code with its semantics.

* ``bf16_gemm``: a small-M bfloat16 GEMM over weights packed once at load time, for AVX-512 CPUs and for AVX2
  ones (same packing, same bits; twin: ``gemm_reference``);
* ``int8_gemm``: the W8A8 matmul, rows quantised to int8 and an exact int32 product (twin: ``w8a8_reference``);
* ``decode_attention``: a step's attention over the KV cache, for every CPU with AVX2 and FMA (twin:
  ``jf_jax.model.cached_attention``); ``decode_attention_in_cache`` reads one layer of every layer's cache in place;
* ``cache_write``: a decode step's KV-cache write, in place (twin: ``lax.dynamic_update_slice``).

``library`` builds nothing: ``python -m cpu_kernels.build`` compiles them (scripts/install.sh runs it) in two
sets, ``library.AVX512`` (the first two) and ``library.AVX2`` (the GEMM, the attention and the cache write), and
``available(set)`` says whether a set runs here. This package imports nothing from ``jf_jax``.
"""

from cpu_kernels.bf16_gemm import PackedWeight, gemm, gemm_reference, pack_weight
from cpu_kernels.int8_gemm import PackedInt8, pack_int8, quantize_rows, unpack_int8, w8a8_matmul, w8a8_reference
from cpu_kernels.decode_attention import available as attention_available, decode_attention, decode_attention_in_cache
from cpu_kernels.decode_attention import supports as attention_supports
from cpu_kernels.cache_write import available as cache_write_available, write_cache
from cpu_kernels.library import available, unavailable_reason

__all__ = ["PackedInt8", "PackedWeight", "attention_available", "attention_supports", "available",
           "cache_write_available", "decode_attention", "decode_attention_in_cache", "gemm", "gemm_reference",
           "pack_int8", "pack_weight", "quantize_rows", "unavailable_reason", "unpack_int8", "w8a8_matmul",
           "w8a8_reference", "write_cache"]
