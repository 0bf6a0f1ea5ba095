"""The KV-cache write of a decode step as an XLA FFI custom call (``cache_write.cc``, in the AVX2 set, which every
x86 CPU the kernels support runs): each layer's block copied in place at each row's committed length.

Its twin is ``jf_jax.model.kv_cache.write_rows`` (a ``lax.dynamic_update_slice`` per row), which XLA:CPU computes
for a 16-bit float cache as a float32 pass over the whole cache at every step; this call copies only the new slots,
with the same result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cpu_kernels import library

KERNEL_SET = library.AVX2
TARGET = "jf_cache_write"


def available() -> bool:
    """Whether the write kernel runs in this process (a CPU backend with the AVX2 set built and allowed)."""
    return library.available(KERNEL_SET)


def write_cache(cache, block, lengths):
    """``cache`` [L, B, S, K, Dh] with ``block`` [L, B, T, K, Dh] (cast to the cache's dtype) written at slots
    ``start_b ... start_b + T - 1`` of every layer of row b, where start_b is ``lengths[b]`` (plus S when
    negative) clamped to [0, S - T], as ``lax.dynamic_update_slice`` reads a start. The result is aliased to
    ``cache``: inside a jitted loop XLA writes the cache's own buffer."""
    if cache.ndim != 5 or block.ndim != 5 or block.shape[:2] != cache.shape[:2] or block.shape[3:] != cache.shape[3:]:
        raise ValueError(f"write_cache: a block shaped {block.shape} does not fit a cache shaped {cache.shape} "
                         f"(expected [L, B, S, K, Dh] and [L, B, T, K, Dh])")
    if block.shape[2] > cache.shape[2]:
        raise ValueError(f"write_cache: a block of {block.shape[2]} slots exceeds the cache's {cache.shape[2]}")
    if not available():
        raise RuntimeError(f"the cache-write kernel cannot run here ({library.unavailable_reason(KERNEL_SET)})")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype), input_output_aliases={0: 0},
                            vmap_method="sequential")
    return call(cache, block.astype(cache.dtype), jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), cache.shape[1:2]))
