"""Decode-step attention over a KV cache as XLA FFI custom calls: ``decode_attention_avx2.cc``, in the AVX2 set,
which every x86 CPU with AVX2 and FMA runs, AVX-512 ones included.

Its plain-JAX twin, with the same semantics, is ``jf_jax.model.cached_attention`` (which calls the kernel where it
runs); the kernel agrees with it to float32 rounding and is batch-invariant on its own, so a process uses it for
every decoder and AR == Jacobi holds bitwise. (An AVX-512 variant, 16 keys per block, was slower than this one on
the AVX512-BF16 Xeon at every context and token count measured, and was removed.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cpu_kernels import library

KERNEL_SET = library.AVX2
"""The set the kernel is built in."""
TARGETS = {jnp.dtype(jnp.bfloat16): "jf_decode_attention_avx2_bf16",
           jnp.dtype(jnp.float32): "jf_decode_attention_avx2_f32"}
"""The kernel's FFI target per dtype."""


def available() -> bool:
    """Whether the kernel runs in this process (False: the plain-JAX twin runs)."""
    return library.available(KERNEL_SET)


def supports(head_dim: int, dtype) -> bool:
    """Shapes and dtypes the kernel handles (the JAX twin handles the rest)."""
    return head_dim % 32 == 0 and jnp.dtype(dtype) in TARGETS


def decode_attention_in_cache(q, k_new, v_new, new_valid, cache_k, cache_v, lengths, layer: int):
    """The attention of layer ``layer`` over every layer's cache, cache_k and cache_v [L, Bc, S, K, Dh], read in
    place (a slice would be a copy per call). Returns (float32 out [B, T, H, Dh], cache_k, cache_v): the caches
    unchanged, as outputs of the call aliased to its inputs, for the caller to hand to the next layer and to write
    the step's keys into (the write then follows every read, and XLA does it in place). Other arguments as
    ``decode_attention``."""
    if not available():
        raise RuntimeError(f"the decode-attention kernel cannot run here ({KERNEL_SET.name}: "
                           f"{library.unavailable_reason(KERNEL_SET)})")
    dtype = jnp.dtype(q.dtype)
    if not supports(q.shape[-1], dtype):
        raise ValueError(f"decode_attention needs a head_dim multiple of 32 and one of "
                         f"{sorted(map(str, TARGETS))}, "
                         f"got head_dim {q.shape[-1]} and {dtype}")
    if cache_k.ndim != 5 or not 0 <= layer < cache_k.shape[0]:
        raise ValueError(f"decode_attention: layer {layer} of a cache shaped {cache_k.shape} (expected "
                         f"[L, Bc, S, K, Dh] with 0 <= layer < L)")
    if cache_k.dtype != dtype or cache_v.dtype != dtype:
        raise ValueError(f"decode_attention: the caches ({cache_k.dtype}, {cache_v.dtype}) must be in the "
                         f"queries' dtype {dtype}")
    args = [x.astype(dtype) for x in (q, k_new, v_new)]
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(cache_k.shape, dtype),
           jax.ShapeDtypeStruct(cache_v.shape, dtype))
    call = jax.ffi.ffi_call(TARGETS[dtype], out, vmap_method="sequential",
                            input_output_aliases={4: 1, 5: 2})
    return call(*args, jnp.asarray(new_valid, jnp.int32), cache_k, cache_v, jnp.asarray(lengths, jnp.int32),
                layer=np.int64(layer))


def decode_attention(q, k_new, v_new, new_valid, cache_k, cache_v, lengths):
    """q [B, T, H, Dh]; k_new, v_new [B, T, K, Dh]; new_valid [B, T]; cache_k, cache_v [Bc, S, K, Dh] (Bc divides
    B: query row b reads cache row b // (B // Bc)); lengths [Bc]. Returns float32 [B, T, H, Dh] (zeros for
    invalid queries)."""
    dtype = jnp.dtype(q.dtype)
    cache_k, cache_v = (x.astype(dtype)[None] for x in (cache_k, cache_v))
    return decode_attention_in_cache(q, k_new, v_new, new_valid, cache_k, cache_v, lengths, 0)[0]
