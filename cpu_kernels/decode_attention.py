"""Decode-step attention over a KV cache as an XLA FFI custom call (``decode_attention.cc``).

Its plain-JAX twin, with the same semantics, is ``jf_jax.model.cached_attention`` (which calls this kernel when
``library.available()``); the two agree to float32 rounding, and each is batch-invariant on its own, so a process
uses one of them for every decoder and AR == Jacobi holds bitwise in either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cpu_kernels import library
from cpu_kernels.library import unavailable_reason

TARGETS = {jnp.dtype(jnp.bfloat16): "jf_decode_attention_bf16", jnp.dtype(jnp.float32): "jf_decode_attention_f32"}


def supports(head_dim: int, dtype) -> bool:
    """Shapes and dtypes the kernel handles (the JAX twin handles the rest)."""
    return head_dim % 32 == 0 and jnp.dtype(dtype) in TARGETS


def decode_attention(q, k_new, v_new, new_valid, cache_k, cache_v, lengths):
    """q [B, T, H, Dh]; k_new, v_new [B, T, K, Dh]; new_valid [B, T]; cache_k, cache_v [Bc, S, K, Dh] (Bc divides
    B: query row b reads cache row b // (B // Bc)); lengths [Bc]. Returns float32 [B, T, H, Dh] (zeros for
    invalid queries)."""
    reason = unavailable_reason(library.AVX512)
    if reason is not None:
        raise RuntimeError(f"the decode-attention kernel cannot run here: {reason}")
    dtype = jnp.dtype(q.dtype)
    if not supports(q.shape[-1], dtype):
        raise ValueError(f"decode_attention needs a head_dim multiple of 32 and one of {sorted(map(str, TARGETS))}, "
                         f"got head_dim {q.shape[-1]} and {dtype}")
    args = [x.astype(dtype) for x in (q, k_new, v_new)]
    cache = [x.astype(dtype) for x in (cache_k, cache_v)]
    return jax.ffi.ffi_call(TARGETS[dtype], jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")(
        *args, jnp.asarray(new_valid, jnp.int32), *cache, jnp.asarray(lengths, jnp.int32))
