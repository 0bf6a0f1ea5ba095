"""A fixed-capacity KV cache with a per-row valid length.

Slot ``s`` of row ``b`` holds the key/value of position ``s``. A forward pass *writes* its block at the row's
current length without moving it; the caller then *commits* the accepted prefix (or nothing, a rollback) by
advancing ``lengths``. Slots at or past ``lengths`` are dead: attention masks them and the next write
overwrites them. Nothing is ever copied to roll back, which is what Jacobi decoding needs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

import cpu_kernels
from jf_jax.model.config import ModelConfig
from jf_jax.model.sharding import HEADS, ROWS, per_device

LAYOUT = (None, ROWS, None, HEADS, None)
"""The cache arrays [L, B, S, K, Dh] (and a block [L, B, T, K, Dh]) as ``sharding.per_device`` runs a CPU kernel on
them: rows over the mesh's batch axes, KV heads over ``tensor``, as the decoders place them."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: jax.Array
    """[L, B, S, K, Dh] rotated keys."""
    v: jax.Array
    """[L, B, S, K, Dh] values."""
    lengths: jax.Array
    """[B] int32: number of committed (valid) slots per row."""

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @staticmethod
    def shape(cfg: ModelConfig, batch_size: int, capacity: int) -> tuple[int, ...]:
        return (cfg.num_layers, batch_size, capacity, cfg.num_kv_heads, cfg.head_dim)

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, capacity: int) -> "KVCache":
        shape = cls.shape(cfg, batch_size, capacity)
        return cls(k=jnp.zeros(shape, cfg.compute_dtype), v=jnp.zeros(shape, cfg.compute_dtype),
                   lengths=jnp.zeros((batch_size,), jnp.int32))

    @classmethod
    def abstract(cls, cfg: ModelConfig, batch_size: int, capacity: int) -> "KVCache":
        shape = cls.shape(cfg, batch_size, capacity)
        kv = jax.ShapeDtypeStruct(shape, cfg.compute_dtype)
        return cls(k=kv, v=kv, lengths=jax.ShapeDtypeStruct((batch_size,), jnp.int32))

    def write(self, k_block, v_block, use_kernel: bool = True) -> "KVCache":
        """Writes [L, B, T, K, Dh] blocks at each row's current length; ``lengths`` do not move.

        The caller guarantees ``lengths + T <= capacity`` (decoders size the cache for the prompt bucket,
        the new tokens and one block); ``dynamic_update_slice`` would otherwise clamp the start silently.
        Where the CPU kernels run (and ``use_kernel``: False in a program built for another platform), the write is
        ``cpu_kernels.write_cache`` (same result): XLA:CPU computes a 16-bit float ``dynamic_update_slice`` as a
        float32 pass over the whole cache, at every decode step. On a mesh each device writes its own rows and KV
        heads, with either (``write_per_device``).
        """
        if k_block.shape[1] != self.batch_size or v_block.shape[1] != self.batch_size:
            raise ValueError(f"KVCache.write: blocks of {k_block.shape[1]} rows for a cache of {self.batch_size}")
        by_rows = functools.partial(write_per_device, write_rows)

        def write(cache, block):
            if not (use_kernel and cpu_kernels.cache_write_available()):
                return by_rows(cache, block, self.lengths)
            return jax.lax.platform_dependent(cache, block, self.lengths, default=by_rows,
                                              cpu=functools.partial(write_per_device, cpu_kernels.write_cache))

        return dataclasses.replace(self, k=write(self.k, k_block), v=write(self.v, v_block))

    def commit(self, num_tokens) -> "KVCache":
        """Advances each row's length by ``num_tokens`` ([B] or scalar): those written slots become valid."""
        return dataclasses.replace(self, lengths=self.lengths + jnp.asarray(num_tokens, jnp.int32))

    def with_lengths(self, lengths) -> "KVCache":
        """Sets the committed lengths (a rollback when smaller): later slots become dead, nothing is copied."""
        return dataclasses.replace(self, lengths=jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), self.lengths.shape))


def write_rows(cache, block, lengths):
    """cache [L, B, S, K, Dh] with block [L, B, T, K, Dh] written at slot ``lengths[b]`` of each row b."""
    # One update per row of the whole array, not a vmapped one: XLA does these in place inside a decode loop,
    # where a vmapped update becomes a pass that rewrites (and first copies) the whole cache.
    block = block.astype(cache.dtype)
    for b in range(cache.shape[1]):
        cache = jax.lax.dynamic_update_slice(cache, block[:, b:b + 1], (0, b, lengths[b], 0, 0))
    return cache


def write_per_device(write, cache, block, lengths):
    """``write(cache, block, lengths)`` (``write_rows`` or its kernel, ``cpu_kernels.write_cache``) run by each device
    on its own rows and KV heads (``sharding.per_device``) under the mesh the program is traced under: a row's write
    touches only its own slots, so nothing moves between devices (XLA cannot partition the kernel's call and would
    gather the whole cache around it, and it partitions ``write_rows``'s per-row updates of a row-split cache into
    collectives over the whole cache), and each device's block is written in place."""
    return per_device(write, (cache, block, lengths), (LAYOUT, LAYOUT, (ROWS,)), LAYOUT)
