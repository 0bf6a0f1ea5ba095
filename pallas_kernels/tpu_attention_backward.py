"""The fused backward of the TPU flash attention: dq, dk and dv kernels over the forward's tile schedule.

Nothing of size T x S is stored: the forward keeps q, k, v, its output and the per-row log-sum-exp (O(T) per
head), and each kernel recomputes a tile's probabilities as ``exp(s - lse)`` under the same per-token mask
(FlashAttention-2, algorithm 2). With ``delta = rowsum(dO * O)``, per visited tile pair:

    P = mask * exp(S - lse)      dV += P^T dO      dP = dO V^T      dS = P * (dP - delta)
    dQ += scale * dS K           dK += scale * dS^T Q

Two kernels, so that every accumulator is owned by one grid program (no atomics). Like the forward, a program
serves the G query heads of one KV head, stacked into [G * block_q, ...] matmul operands:

* **dq**: grid (batch, KV head, query tile, key slot), the forward's schedule (key tiles per query tile).
* **dk, dv**: grid (batch, KV head, key tile, query slot) over the transposed schedule (query tiles that visit
  each key tile). Contracting over the stacked [G * block_q] rows sums the group's query heads (GQA) for free.

Both scalar-prefetch their schedule and predicate skipped slots off, as the forward does (``tpu_attention``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.mask import TokenMeta
from pallas_kernels.tpu_attention import (TpuInputs, TpuStatic, compiler_params, dot_precision, flat_schedule,
                                          masked_scores, prepare, query_tile_grid, stacked_dot)

_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def _probabilities(q, k_ref, q_cols_ref, k_rows_ref, lse_ref, *, scale, mask_kind, precision):
    """The forward's softmax [G, bq, bk], recomputed from its saved log-sum-exp [G, bq, 1]."""
    s, mask = masked_scores(q, k_ref[...], q_cols_ref[...], k_rows_ref[...], scale=scale, mask_kind=mask_kind,
                            precision=precision)
    return jnp.where(mask, jnp.exp(s - lse_ref[...]), 0.0)


def _stack(x):
    """[G, m, n] -> [G * m, n]: the group's heads as rows of one matmul operand (bq is a multiple of 16)."""
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2])


def _dq_kernel(schedule_ref, counts_ref, q_ref, k_ref, v_ref, q_cols_ref, k_rows_ref, do_ref, lse_ref, delta_ref,
               dq_ref, dq_scratch, *, scale: float, mask_kind: str, precision):
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _start():
        dq_scratch[...] = jnp.zeros(dq_scratch.shape, jnp.float32)

    @pl.when(j < counts_ref[b * pl.num_programs(2) + i])
    def _visit():
        p = _probabilities(q_ref[...], k_ref, q_cols_ref, k_rows_ref, lse_ref, scale=scale, mask_kind=mask_kind,
                           precision=precision)
        dp = masked_scores(do_ref[...], v_ref[...], q_cols_ref[...], k_rows_ref[...], scale=1.0,
                           mask_kind=mask_kind, precision=precision)[0]  # dO V^T; masked entries have p = 0
        ds = p * (dp - delta_ref[...])
        k = k_ref[...]
        dq_scratch[...] += scale * stacked_dot(ds.astype(k.dtype), k, precision)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = dq_scratch[...].astype(dq_ref.dtype)


def _dkv_kernel(schedule_ref, counts_ref, q_ref, k_ref, v_ref, q_cols_ref, k_rows_ref, do_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, dk_scratch, dv_scratch, *, scale: float, mask_kind: str, precision):
    b, kj, t = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(t == 0)
    def _start():
        dk_scratch[...] = jnp.zeros(dk_scratch.shape, jnp.float32)
        dv_scratch[...] = jnp.zeros(dv_scratch.shape, jnp.float32)

    @pl.when(t < counts_ref[b * pl.num_programs(2) + kj])
    def _visit():
        q, do = q_ref[...], do_ref[...]
        p = _probabilities(q, k_ref, q_cols_ref, k_rows_ref, lse_ref, scale=scale, mask_kind=mask_kind,
                           precision=precision)
        dv_scratch[...] += lax.dot_general(_stack(p.astype(do.dtype)), _stack(do), _TN, precision=precision,
                                           preferred_element_type=jnp.float32)
        dp = masked_scores(do, v_ref[...], q_cols_ref[...], k_rows_ref[...], scale=1.0, mask_kind=mask_kind,
                           precision=precision)[0]
        ds = p * (dp - delta_ref[...])
        dk_scratch[...] += scale * lax.dot_general(_stack(ds.astype(q.dtype)), _stack(q), _TN, precision=precision,
                                                   preferred_element_type=jnp.float32)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = dk_scratch[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_scratch[...].astype(dv_ref.dtype)


def _dq_call(inputs: TpuInputs, do, lse, delta, static: TpuStatic):
    B, H, T_pad, D = inputs.q.shape
    group, bq = H // inputs.k.shape[1], static.block_q
    g = query_tile_grid(inputs, static)  # the forward's grid: dq accumulates over the key tiles a query tile visits
    kernel = functools.partial(_dq_kernel, scale=static.scale, mask_kind=static.mask_kind,
                               precision=dot_precision(inputs.q.dtype))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=g.grid,
            in_specs=[g.q_spec, g.kv_spec, g.kv_spec, *g.meta_specs, g.q_spec, g.row_spec, g.row_spec],
            out_specs=g.q_spec,
            scratch_shapes=[pltpu.VMEM((group, bq, D), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(inputs.q.shape, inputs.q.dtype),
        name="jf_flash_attention_tpu_dq",
        **compiler_params(static, ("parallel", "parallel", "parallel", "arbitrary")),
    )(g.schedule, g.counts, inputs.q, inputs.k, inputs.v, inputs.q_cols, inputs.k_rows, do, lse, delta)


def _dkv_call(inputs: TpuInputs, do, lse, delta, static: TpuStatic):
    B, H, T_pad, D = inputs.q.shape
    K, S_pad = inputs.k.shape[1], inputs.k.shape[2]
    group, bq, bk = H // K, static.block_q, static.block_k
    nq, nk = T_pad // bq, S_pad // bk
    # The transposed schedule: for each key tile, the query tiles whose schedule lists it.
    schedule, counts = flat_schedule(jnp.swapaxes(inputs.visit, 1, 2))

    def query_tile(b, kj, t, schedule_ref):
        return schedule_ref[(b * nk + kj) * nq + t]

    q_spec = pl.BlockSpec((None, group, bq, D), lambda b, kh, kj, t, s, _: (b, kh, query_tile(b, kj, t, s), 0))
    row_spec = pl.BlockSpec((None, group, bq, 1), lambda b, kh, kj, t, s, _: (b, kh, query_tile(b, kj, t, s), 0))
    kv_spec = pl.BlockSpec((None, None, bk, D), lambda b, kh, kj, t, *_: (b, kh, kj, 0))
    kernel = functools.partial(_dkv_kernel, scale=static.scale, mask_kind=static.mask_kind,
                               precision=dot_precision(inputs.q.dtype))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(B, K, nk, nq),
            in_specs=[q_spec, kv_spec, kv_spec,
                      pl.BlockSpec((None, bq, 4), lambda b, kh, kj, t, s, _: (b, query_tile(b, kj, t, s), 0)),
                      pl.BlockSpec((None, 4, bk), lambda b, kh, kj, t, *_: (b, 0, kj)),
                      q_spec, row_spec, row_spec],
            out_specs=[kv_spec, kv_spec],
            scratch_shapes=[pltpu.VMEM((bk, D), jnp.float32), pltpu.VMEM((bk, D), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(inputs.k.shape, inputs.k.dtype)] * 2,
        name="jf_flash_attention_tpu_dkv",
        **compiler_params(static, ("parallel", "parallel", "parallel", "arbitrary")),
    )(schedule, counts, inputs.q, inputs.k, inputs.v, inputs.q_cols, inputs.k_rows, do, lse, delta)


@functools.partial(jax.jit, static_argnames=("static",))
def backward(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, out, lse, d_out, static: TpuStatic):
    """(dq, dk, dv) of ``tpu_attention.forward`` at cotangent ``d_out``; ``out`` and ``lse`` are its residuals."""
    T, S = q.shape[1], k.shape[1]
    inputs = prepare(q, k, v, q_meta, k_meta, static)
    T_pad = inputs.q.shape[2]
    # delta = rowsum(dO * O) per (row, head), elementwise in float32 (an einsum would be a reduced-precision dot).
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, T, H]
    delta = jnp.pad(delta, ((0, 0), (0, T_pad - T), (0, 0))).transpose(0, 2, 1)[..., None]
    do = jnp.pad(d_out.astype(q.dtype), ((0, 0), (0, T_pad - T), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    dq = _dq_call(inputs, do, lse, delta, static)
    dk, dv = _dkv_call(inputs, do, lse, delta, static)
    untranspose = lambda x, n: x.transpose(0, 2, 1, 3)[:, :n]  # noqa: E731
    return untranspose(dq, T), untranspose(dk, S), untranspose(dv, S)
