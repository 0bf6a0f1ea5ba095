"""The tile schedule of the flash-attention kernels: which (query tile, key tile) pairs can hold a visible pair.

Plain JAX, run in the kernels' wrappers at O(T + S) work plus O(nq * nk) for the tile pairs. Each query/key tile
is summarised per stream (context, noisy, clean) by the min/max of its valid tokens' position, block and
segment; ``tile_visit_mask`` restates ``mask.allowed`` on those intervals, so a pair it marks "skip" is fully
masked; ``tile_schedule`` compacts the visited key tiles of each query tile into a list. The Triton kernel
(``flash_attention``) and the TPU kernels (``tpu_attention``, ``tpu_attention_backward``) share it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.mask import (MASK_CLEAN_CONTEXT, MASK_KINDS, MASK_NOISE_CONDITIONED, STREAM_CLEAN,
                                 STREAM_CONTEXT, STREAM_NOISY, TokenMeta)

_STREAMS = (STREAM_CONTEXT, STREAM_NOISY, STREAM_CLEAN)
# Sentinels for empty summaries: an empty set has min > max, so every interval comparison with it is False.
_BIG = 1 << 30


class TileSummary(NamedTuple):
    """Per (row, tile, stream) min/max over the tile's valid tokens of that stream; fields [B, n_tiles, 3]."""

    pos_min: jax.Array
    pos_max: jax.Array
    block_min: jax.Array
    block_max: jax.Array
    seg_min: jax.Array
    seg_max: jax.Array


def tile_summary(meta: TokenMeta, tile: int) -> TileSummary:
    """Summaries of ``meta`` ([B, N] fields, N a multiple of ``tile``) per tile and per stream.

    Padding tokens (segment < 0) take part in nothing, so they are left out: a tile of padding is empty.
    Streams other than context/noisy/clean are not summarised (``mask.py`` defines only those three).
    """
    B, N = meta.position.shape
    if N % tile:
        raise ValueError(f"sequence length {N} is not a multiple of the tile {tile}")
    split = lambda x: x.reshape(B, N // tile, 1, tile)  # noqa: E731
    streams = jnp.asarray(_STREAMS, jnp.int32).reshape(1, 1, len(_STREAMS), 1)
    member = (split(meta.segment) >= 0) & (split(meta.stream) == streams)  # [B, n, 3, tile]
    lo = lambda x: jnp.min(jnp.where(member, split(x), _BIG), axis=-1)  # noqa: E731
    hi = lambda x: jnp.max(jnp.where(member, split(x), -_BIG), axis=-1)  # noqa: E731
    return TileSummary(lo(meta.position), hi(meta.position), lo(meta.block), hi(meta.block),
                       lo(meta.segment), hi(meta.segment))


def tile_visit_mask(q_meta: TokenMeta, k_meta: TokenMeta, block_q: int, block_k: int,
                    mask_kind: str = MASK_NOISE_CONDITIONED):
    """[B, T/block_q, S/block_k] bool: False only where no (query, key) pair of the two tiles is visible.

    Mirrors ``mask.allowed`` clause by clause on intervals, for every (query stream, key stream) pair: an
    interval comparison is True whenever some pair of members satisfies the elementwise one, so a skipped
    tile pair is fully masked. Lengths must already be multiples of the tiles (``attention`` pads).
    """
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {mask_kind!r}; expected one of {MASK_KINDS}")
    qs, ks = tile_summary(q_meta, block_q), tile_summary(k_meta, block_k)
    Q = TileSummary(*(f[:, :, None, :, None] for f in qs))  # [B, nq, 1, 3 (q stream), 1]
    K = TileSummary(*(f[:, None, :, None, :] for f in ks))  # [B, 1, nk, 1, 3 (k stream)]
    sq = jnp.asarray(_STREAMS, jnp.int32)[:, None]
    sk = jnp.asarray(_STREAMS, jnp.int32)[None, :]
    same_segment = (K.seg_min <= Q.seg_max) & (Q.seg_min <= K.seg_max)
    causal = K.pos_min <= Q.pos_max
    earlier_block = K.block_min < Q.block_max
    block_overlap = (K.block_min <= Q.block_max) & (Q.block_min <= K.block_max)
    visible = ((sk == STREAM_CONTEXT) & causal) | ((sq == sk) & (earlier_block | (block_overlap & causal)))
    if mask_kind == MASK_CLEAN_CONTEXT:
        visible |= (sq == STREAM_NOISY) & (sk == STREAM_CLEAN) & earlier_block
    return jnp.any(same_segment & visible, axis=(-2, -1))


def tile_schedule(visit):
    """Compacts a [B, nq, nk] visit mask into [B, nq, nk'] key-tile indices, ascending, padded with -1.

    nk' is nk rounded up to a power of two because Triton tensors must have power-of-two shapes. The t-th
    visited tile is the number of tiles whose inclusive visit count is <= t: a compare-and-sum, cheaper to
    compile than a sort or a scatter.
    """
    B, nq, nk = visit.shape
    slots = jnp.arange(pl.next_power_of_2(nk), dtype=jnp.int32)  # [nk']
    counts = jnp.cumsum(visit.astype(jnp.int32), axis=-1)  # [B, nq, nk]
    index = jnp.sum(counts[..., None, :] <= slots[:, None], axis=-1, dtype=jnp.int32)  # [B, nq, nk']
    return jnp.where(slots < counts[..., -1:], index, -1)


def repeat_last_schedule(visit):
    """[B, nq, nk] visit mask -> (schedule [B, nq, nk] int32, counts [B, nq] int32) for the TPU grid.

    The TPU kernels step over a grid axis of nk key-tile slots. Slots past the count repeat the last visited
    tile, so the block index of K and V does not change and the pipeline issues no copy for them; a row that
    visits nothing names tile 0 (one wasted copy, no compute). Any length works: no power of two is needed.
    """
    nk = visit.shape[-1]
    schedule = tile_schedule(visit)[..., :nk]
    counts = jnp.sum(visit, axis=-1, dtype=jnp.int32)
    last = jnp.maximum(jnp.max(schedule, axis=-1, keepdims=True), 0)  # the list is ascending
    return jnp.where(schedule >= 0, schedule, last), counts


def tile_sparsity(q_meta: TokenMeta, k_meta: TokenMeta, *, block_q: int, block_k: int,
                  mask_kind: str = MASK_NOISE_CONDITIONED):
    """Fraction of (row, query tile, key tile) triples the kernel skips, after padding to the tiles."""
    T, S = q_meta.position.shape[1], k_meta.position.shape[1]
    visit = tile_visit_mask(pad_meta(q_meta, round_up(T, block_q)), pad_meta(k_meta, round_up(S, block_k)),
                            block_q, block_k, mask_kind)
    return 1.0 - jnp.mean(visit.astype(jnp.float32))


def pad_meta(meta: TokenMeta, length: int) -> TokenMeta:
    """Pads [B, N] metadata to ``length`` with padding tokens (segment -1: never visible, zero output)."""
    extra = length - meta.position.shape[1]
    fill = TokenMeta(position=0, segment=-1, stream=STREAM_CONTEXT, block=-1)
    return TokenMeta(*(jnp.pad(jnp.asarray(f, jnp.int32), ((0, 0), (0, extra)), constant_values=c)
                       for f, c in zip(meta, fill)))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
