"""Per-token mask data (``TokenMeta``) for the situations the model meets: plain causal text, a KV cache.

Attention never receives a dense mask from its caller: it receives these per-token arrays and evaluates
``pallas_kernels.mask.allowed`` itself (densely in the reference, per tile in the kernel). The packed
training layout builds its own ``TokenMeta`` with noisy/clean streams and block ids.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.mask import STREAM_CONTEXT, TokenMeta


def causal_meta(positions, valid=None) -> TokenMeta:
    """Ordinary causal tokens at ``positions`` [B, T]; ``valid`` [B, T] (default all) marks padding as False."""
    positions = jnp.asarray(positions, jnp.int32)
    segment = jnp.zeros_like(positions) if valid is None else jnp.where(valid, 0, -1).astype(jnp.int32)
    return TokenMeta(position=positions, segment=segment,
                     stream=jnp.full_like(positions, STREAM_CONTEXT), block=jnp.full_like(positions, -1))


def cache_key_meta(lengths, capacity: int) -> TokenMeta:
    """Key data of a KV cache whose slot s holds position s; slots at or past ``lengths`` [B] are invalid."""
    lengths = jnp.asarray(lengths, jnp.int32)
    slots = jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (lengths.shape[0], capacity))
    return causal_meta(slots, valid=slots < lengths[:, None])


def concat_meta(a: TokenMeta, b: TokenMeta) -> TokenMeta:
    """Concatenates two token sets along the sequence axis (e.g. cached keys followed by new keys)."""
    return TokenMeta(*(jnp.concatenate([x, y], axis=1) for x, y in zip(a, b)))
