"""The fused backward of the Triton flash attention (``flash_attention``): a dq kernel and a dk/dv kernel.

Nothing of size T x S is stored: the forward keeps q, k, v, its output and the per-row log-sum-exp (O(T) per
head), and each kernel recomputes a tile's probabilities as ``exp(s - lse)`` under the same per-token mask,
evaluated in the kernel with ``mask.allowed`` as the forward does (FlashAttention-2, algorithm 2). With
``delta = rowsum(dO * O)`` (computed in the wrapper), per visited tile pair:

    P = mask * exp(S - lse)      dV += P^T dO      dP = dO V^T      dS = P * (dP - delta)
    dQ += scale * dS K           dK += scale * dS^T Q

Two kernels, so that every accumulator is owned by one program and lives in its registers: Triton programs of
one launch run concurrently, so summing into one output from several programs would need atomic adds, whose
float order (and so the result) changes from run to run.

* **dq** (``_dq_kernel``): one program per (batch, query head, query tile), like the forward: the query tile, dO
  and the dq accumulator stay resident while the key loop runs over the forward's schedule (``schedule.py``).
* **dk, dv** (``_dkv_kernel``): one program per (batch, KV head, key tile), over the transposed schedule (the query
  tiles that visit the key tile). It owns its dk/dv tile, so it also loops over the G = H / K query heads of its
  KV head: their contributions (GQA) are summed in registers rather than by a reduction over H afterwards.

Tiles: dq uses the forward's (block_q queries resident, block_k keys streamed); dk/dv swaps them (block_q keys
resident, block_k queries streamed). The streamed tiles are what Triton's software pipeline buffers in shared
memory, num_stages deep, so the swap keeps each kernel's buffers the size of the forward's. Unswapped, the Hopper
rows of ``tuning.TILE_SIZES`` (128 x 32, 3 stages) would buffer two 128-row tiles (Q and dO) per stage: 128 KB in
float32 at head dim 128, so two stages alone pass the ~227 KB a block may have (a count, not a measurement: no
GPU has compiled these kernels yet). Lengths are padded to both kernels' tiles.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.mask import TokenMeta, allowed
from pallas_kernels.schedule import pad_meta, round_up, tile_schedule, tile_visit_mask
from pallas_kernels.tuning import BlockSizes


def _entry(schedule, t):
    """Element t of a loaded schedule row, as a masked reduction (the forward's way: a vector op every Pallas
    backend lowers, where a scalar read of a loaded tensor is not)."""
    lanes = lax.broadcasted_iota(jnp.int32, schedule.shape, 0)
    return jnp.sum(jnp.where(lanes == t, schedule, 0))


def _dot(a, b, precision):
    return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def _dq_kernel(schedule_ref, q_ref, k_ref, v_ref, q_meta_ref, k_meta_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
               scale: float, block_k: int, mask_kind: str, precision):
    """One (batch, query head, query tile). Refs: schedule [nk'], q/dO/dq [bq, D], k/v [S, D], q-meta [4, bq],
    k-meta [4, S], lse/delta [bq]."""
    block_q, head_dim = q_ref.shape
    schedule = schedule_ref[...]
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]
    q_meta = TokenMeta(*(q_meta_ref[f, :][:, None] for f in range(4)))  # fields [bq, 1]

    def body(t, dq):
        keys = pl.ds(pl.multiple_of(_entry(schedule, t) * block_k, block_k), block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        k_meta = TokenMeta(*(k_meta_ref[f, keys][None, :] for f in range(4)))  # fields [1, bk]
        mask = allowed(q_meta, k_meta, mask_kind)
        # The forward's probabilities (s <= lse where visible: no overflow); masked entries are zeroed explicitly.
        p = jnp.where(mask, jnp.exp(_dot(q, k.T, precision) * scale - lse), 0.0)
        ds = p * (_dot(do, v.T, precision) - delta)
        return dq + _dot(ds.astype(k.dtype), k, precision)

    num_visits = jnp.sum((schedule >= 0).astype(jnp.int32))
    dq = lax.fori_loop(0, num_visits, body, jnp.zeros((block_q, head_dim), jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(schedule_ref, q_ref, k_ref, v_ref, q_meta_ref, k_meta_ref, do_ref, lse_ref, delta_ref, dk_ref,
                dv_ref, *, scale: float, block_q: int, mask_kind: str, precision):
    """One (batch, KV head, key tile). Refs: schedule [nq'] (query tiles visiting this key tile), q/dO [T, G, D]
    (the G query heads of this KV head), k/v/dk/dv [bk, D], q-meta [4, T], k-meta [4, bk], lse/delta [G, T]."""
    block_k, head_dim = k_ref.shape
    group = q_ref.shape[1]
    schedule = schedule_ref[...]
    # Loaded once even when no query tile visits this key tile: such a program then stores zeros and no more.
    k, v = k_ref[...], v_ref[...]
    k_meta = TokenMeta(*(k_meta_ref[f, :][None, :] for f in range(4)))  # fields [1, bk]

    num_visits = jnp.sum((schedule >= 0).astype(jnp.int32))

    # Heads outside, visits inside: the visit loop is the long one, whose Q and dO loads Triton's software
    # pipeline should overlap with the dots, and the pipeliner works on innermost loops. The mask is the same for
    # every head; re-evaluating it per head is integer compares, cheap beside the four dots.
    def head(g, carry):
        def visit(t, carry):
            dk, dv = carry
            rows = pl.ds(pl.multiple_of(_entry(schedule, t) * block_q, block_q), block_q)
            mask = allowed(TokenMeta(*(q_meta_ref[f, rows][:, None] for f in range(4))), k_meta, mask_kind)
            q, do = q_ref[rows, g, :], do_ref[rows, g, :]
            p = jnp.where(mask, jnp.exp(_dot(q, k.T, precision) * scale - lse_ref[g, rows][:, None]), 0.0)
            dv = dv + _dot(p.astype(do.dtype).T, do, precision)
            ds = p * (_dot(do, v.T, precision) - delta_ref[g, rows][:, None])
            return dk + _dot(ds.astype(q.dtype).T, q, precision), dv

        return lax.fori_loop(0, num_visits, visit, carry)

    zeros = jnp.zeros((block_k, head_dim), jnp.float32)
    dk, dv = lax.fori_loop(0, group, head, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def tile_sizes(block_sizes: BlockSizes, T: int, S: int):
    """((block_q, block_k) of dq, (block_q, block_k) of dk/dv), each shrunk for short inputs as the forward's
    are: dq takes the forward's tiles, dk/dv the swapped ones (the module docstring says why)."""
    fit = lambda tile, n: min(tile, max(16, pl.next_power_of_2(n)))  # noqa: E731
    return ((fit(block_sizes.block_q, T), fit(block_sizes.block_k, S)),
            (fit(block_sizes.block_k, T), fit(block_sizes.block_q, S)))


def _launch(kernel, grid, in_specs, out_specs, out_shape, block_sizes: BlockSizes, interpret: bool, name: str):
    compiler_params = None
    if not interpret:
        from jax.experimental.pallas import triton as plgpu  # GPU-only import, kept out of CPU paths

        # Triton's parameters also select the Triton lowering: a GPU pallas_call without them goes to Mosaic GPU.
        compiler_params = plgpu.CompilerParams(num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages)
    return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
                          compiler_params=compiler_params, interpret=interpret, name=name)


@functools.partial(jax.jit, static_argnames=("mask_kind", "scale", "block_sizes", "interpret", "precision"))
def backward(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, out, lse, d_out, *, mask_kind: str, scale: float,
             block_sizes: BlockSizes, interpret: bool, precision=None):
    """(dq, dk, dv) of the Triton forward at cotangent ``d_out``. q, out, d_out [B, T, H, D]; k, v [B, S, K, D];
    lse [B, H, T] float32, the forward's log-sum-exp per row (0 where a row sees nothing); ``precision``: of every
    dot (the forward's, ``flash_attention._dot_precision``)."""
    B, T, H, D = q.shape
    S, K = k.shape[1], k.shape[2]
    group = H // K
    (bq, bk), (bq_kv, bk_kv) = tile_sizes(block_sizes, T, S)
    T_pad, S_pad = round_up(T, max(bq, bq_kv)), round_up(S, max(bk, bk_kv))
    D_pad = max(16, pl.next_power_of_2(D))  # as in the forward: Triton dims are powers of two, at least 16
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, D_pad - D)))  # noqa: E731
    # delta = rowsum(dO * O) per (row, head), elementwise in float32 (an einsum would be a reduced-precision dot).
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1).transpose(0, 2, 1)  # [B, H, T]
    lse, delta = (jnp.pad(x, ((0, 0), (0, 0), (0, T_pad - T))) for x in (lse, delta))
    q, do, k, v = pad(q, T_pad), pad(d_out.astype(q.dtype), T_pad), pad(k, S_pad), pad(v, S_pad)
    q_meta, k_meta = pad_meta(q_meta, T_pad), pad_meta(k_meta, S_pad)
    q_rows, k_rows = jnp.stack(q_meta, axis=1), jnp.stack(k_meta, axis=1)  # [B, 4, N]: one small load per tile

    # dq: the forward's grid and schedule.
    schedule = tile_schedule(tile_visit_mask(q_meta, k_meta, bq, bk, mask_kind))
    q_spec = pl.BlockSpec((None, bq, None, D_pad), lambda b, h, i: (b, i, h, 0))
    kv_all = pl.BlockSpec((None, S_pad, None, D_pad), lambda b, h, i: (b, 0, h // group, 0))
    row_spec = pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i))
    dq = _launch(
        functools.partial(_dq_kernel, scale=scale, block_k=bk, mask_kind=mask_kind, precision=precision),
        (B, H, T_pad // bq),
        [pl.BlockSpec((None, None, schedule.shape[2]), lambda b, h, i: (b, i, 0)), q_spec, kv_all, kv_all,
         pl.BlockSpec((None, 4, bq), lambda b, h, i: (b, 0, i)),
         pl.BlockSpec((None, 4, S_pad), lambda b, h, i: (b, 0, 0)), q_spec, row_spec, row_spec],
        q_spec, jax.ShapeDtypeStruct(q.shape, q.dtype), block_sizes, interpret, "jf_flash_attention_dq",
    )(schedule, q, k, v, q_rows, k_rows, do, lse, delta)

    # dk, dv: per key tile, the query tiles that visit it. Splitting H into (K, G) is free ([B, T, H, D] is
    # row-major with h = kh * G + g, the forward's h // group) and lets one block hold a KV head's G query heads.
    schedule = tile_schedule(jnp.swapaxes(tile_visit_mask(q_meta, k_meta, bq_kv, bk_kv, mask_kind), 1, 2))
    q_group = pl.BlockSpec((None, T_pad, None, group, D_pad), lambda b, kh, j: (b, 0, kh, 0, 0))
    kv_spec = pl.BlockSpec((None, bk_kv, None, D_pad), lambda b, kh, j: (b, j, kh, 0))
    rows_group = pl.BlockSpec((None, None, group, T_pad), lambda b, kh, j: (b, kh, 0, 0))
    by_group = lambda x: x.reshape(B, K, group, T_pad)  # noqa: E731
    dk, dv = _launch(
        functools.partial(_dkv_kernel, scale=scale, block_q=bq_kv, mask_kind=mask_kind, precision=precision),
        (B, K, S_pad // bk_kv),
        [pl.BlockSpec((None, None, schedule.shape[2]), lambda b, kh, j: (b, j, 0)), q_group, kv_spec, kv_spec,
         pl.BlockSpec((None, 4, T_pad), lambda b, kh, j: (b, 0, 0)),
         pl.BlockSpec((None, 4, bk_kv), lambda b, kh, j: (b, 0, j)), q_group, rows_group, rows_group],
        [kv_spec, kv_spec], [jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2, block_sizes, interpret,
        "jf_flash_attention_dkv",
    )(schedule, q.reshape(B, T_pad, K, group, D_pad), k, v, q_rows, k_rows, do.reshape(B, T_pad, K, group, D_pad),
      by_group(lse), by_group(delta))
    return dq[:, :T, :, :D], dk[:, :S, :, :D], dv[:, :S, :, :D]
