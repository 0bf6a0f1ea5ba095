"""The noise-aware flash attention as a Pallas TPU (Mosaic) kernel: forward, and the pieces its backward shares.

Semantics of ``attention_reference`` (masked GQA attention, float32 softmax, zero rows for queries that may
attend nothing); ``flash_attention.attention(..., backend="tpu")`` is the entry point. How it maps to a TPU:

* **Layout.** Pallas TPU blocks must have their last two dimensions either tile-aligned (8 sublanes x 128 lanes)
  or equal to the array's, so a block cannot take one head out of [B, T, H, D]. The wrapper transposes to
  [B, H, T, D] (and [B, K, S, D]) and blocks are (block_q, D) / (block_k, D) with D whole. The per-token data
  travels twice: query fields as columns, [B, T, 4] (queries on sublanes, so a field is a [bq, 1] vector that
  broadcasts along a score tile's lanes), key fields as rows, [B, 4, S] (keys on lanes, [1, bk]). The key
  rows' lane dimension is why compiled TPU tiles need ``block_k`` a multiple of 128 (or one tile for all keys).
* **Grid and schedule.** Grid (batch, KV head, query tile, key slot); a program serves all G = H / K query
  heads of its KV head (GQA), stacked into one [G * block_q, D] matmul operand, so a K/V tile is copied once
  per group rather than once per query head. The key-slot axis is sequential ("arbitrary") and carries the
  online softmax in VMEM scratch. The per-(row, query tile) list of key tiles to visit
  (``schedule.repeat_last_schedule``) is scalar-prefetched into SMEM, and the K/V/key-data index maps read it:
  slot j loads key tile ``schedule[b, i, j]``. Slots past the count repeat the last tile, so the pipeline skips
  their copies, and the body is predicated off: a skipped tile costs an empty grid step, no copy and no
  compute. (Index maps avoid ``//``: floor division lowers through ``sign``, whose Mosaic rule asks the local
  device for its TPU generation and so fails when lowering for a TPU on a CPU host.)
* **Numerics.** Scores, running max and sums, and the P.V accumulator are float32; float32 inputs run their dots
  at ``Precision.HIGHEST`` (a TPU's default float32 matmul is a single bf16 pass), bfloat16 inputs run bf16 MXU
  passes with float32 accumulation. The forward also returns the log-sum-exp of each row, the backward's
  residual (``tpu_attention_backward``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.mask import TokenMeta, allowed
from pallas_kernels.schedule import pad_meta, repeat_last_schedule, round_up, tile_visit_mask

# Finite (not -inf) so that exp(s - m) never sees inf - inf; masked probabilities are zeroed explicitly.
MASK_VALUE = -1e30
# Contract the last dimension of both operands: q @ k.T without materialising k.T.
_NT = (((1,), (1,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class TpuStatic:
    """What a TPU kernel specialises on (hashable: a static argument of the jitted wrappers)."""

    mask_kind: str
    scale: float
    block_q: int
    block_k: int
    interpret: bool


class TpuInputs(NamedTuple):
    """The kernels' operands, padded and laid out for the TPU (see the module docstring)."""

    q: jax.Array  # [B, H, T', D]
    k: jax.Array  # [B, K, S', D]
    v: jax.Array  # [B, K, S', D]
    q_cols: jax.Array  # [B, T', 4] int32: TokenMeta fields of the queries, one per lane
    k_rows: jax.Array  # [B, 4, S'] int32: TokenMeta fields of the keys, one per sublane
    visit: jax.Array  # [B, T'/block_q, S'/block_k] bool: tile pairs that may hold a visible pair


def tile_sizes(block_q: int, block_k: int, T: int, S: int) -> tuple[int, int]:
    """Tiles shrunk for short inputs (a 16-token draft block should not pay for a 128-row tile). A shrunk key
    tile covers all keys in one tile, which is what the TPU layout allows besides multiples of 128; so key tiles
    of at least 128 (``tuning.tpu_block_sizes``, the default) are legal at every length."""
    return min(block_q, max(16, pl.next_power_of_2(T))), min(block_k, max(16, pl.next_power_of_2(S)))


def check_compiled_tiles(block_q: int, block_k: int, S_pad: int) -> None:
    """Mosaic's block rule, checked before lowering so the error names the tile rather than a layout."""
    if block_q % 8:
        raise ValueError(f"TPU block_q must be a multiple of 8 (sublanes), got {block_q}")
    if block_k % 128 and block_k != S_pad:
        raise ValueError(f"TPU block_k must be a multiple of 128 (lanes) or cover all {S_pad} keys, got {block_k}")


def prepare(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, static: TpuStatic) -> TpuInputs:
    """Pads T and S to the tiles (padding tokens get segment -1: never visible, zero rows) and transposes."""
    T, S = q.shape[1], k.shape[1]
    T_pad, S_pad = round_up(T, static.block_q), round_up(S, static.block_k)
    if not static.interpret:
        check_compiled_tiles(static.block_q, static.block_k, S_pad)
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0))).transpose(0, 2, 1, 3)  # noqa: E731
    q_meta, k_meta = pad_meta(q_meta, T_pad), pad_meta(k_meta, S_pad)
    visit = tile_visit_mask(q_meta, k_meta, static.block_q, static.block_k, static.mask_kind)
    return TpuInputs(pad(q, T_pad), pad(k, S_pad), pad(v, S_pad), jnp.stack(q_meta, axis=-1),
                     jnp.stack(k_meta, axis=1), visit)


def flat_schedule(visit):
    """The scalar-prefetch operands: (schedule, counts) flattened to 1-D, since SMEM pads the minor dimensions of
    a multi-dimensional array; entry (b, i, j) is at (b * n_i + i) * n_j + j, count (b, i) at b * n_i + i."""
    schedule, counts = repeat_last_schedule(visit)
    return schedule.reshape(-1), counts.reshape(-1)


def dot_precision(dtype):
    """float32 inputs get full-precision dots (the TPU default is one bf16 pass); bf16 keeps the default."""
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def masked_scores(q, k, q_cols, k_rows, *, scale: float, mask_kind: str, precision):
    """Scaled scores [G, bq, bk] float32 with masked entries at MASK_VALUE, and the mask [1, bq, bk].

    q [G, bq, D] (the G query heads of one KV head), k [bk, D], q_cols [bq, 4] (query fields by lane), k_rows
    [4, bk] (key fields by sublane). The G heads are stacked into one [G * bq, D] operand: one MXU matmul against
    the shared key tile, and a reshape that keeps the (8, 128) tiling because bq is a multiple of 16.
    """
    G, bq, D = q.shape
    q_meta = TokenMeta(*(q_cols[:, f:f + 1] for f in range(4)))  # fields [bq, 1]
    k_meta = TokenMeta(*(k_rows[f:f + 1, :] for f in range(4)))  # fields [1, bk]
    mask = allowed(q_meta, k_meta, mask_kind)[None]  # the same for every head of the group
    s = lax.dot_general(q.reshape(G * bq, D), k, _NT, precision=precision, preferred_element_type=jnp.float32)
    return jnp.where(mask, s.reshape(G, bq, -1) * scale, MASK_VALUE), mask


def stacked_dot(a, b, precision):
    """[G, m, n] @ [n, d] -> [G, m, d] float32, as one [G * m, n] matmul."""
    G, m, n = a.shape
    return jnp.dot(a.reshape(G * m, n), b, precision=precision, preferred_element_type=jnp.float32).reshape(G, m, -1)


def compiler_params(static: TpuStatic, semantics: tuple[str, ...]):
    """Interpret mode simulates the TPU on the host (no Mosaic compile); otherwise the grid's semantics."""
    if static.interpret:
        return dict(interpret=pltpu.InterpretParams())
    return dict(compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------

def _forward_kernel(schedule_ref, counts_ref, q_ref, k_ref, v_ref, q_cols_ref, k_rows_ref, o_ref, lse_ref,
                    m_scratch, l_scratch, acc_scratch, *, scale: float, mask_kind: str, precision):
    """Grid step (b, kv head, i, j): fold key tile schedule[b, i, j] into query tile i's online softmax, for the
    G query heads of the KV head at once. Scratch: running max and sum [G, bq, 1], accumulator [G, bq, D]."""
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    num_slots = pl.num_programs(3)

    @pl.when(j == 0)
    def _start():
        m_scratch[...] = jnp.full(m_scratch.shape, MASK_VALUE, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    @pl.when(j < counts_ref[b * pl.num_programs(2) + i])
    def _visit():
        s, mask = masked_scores(q_ref[...], k_ref[...], q_cols_ref[...], k_rows_ref[...], scale=scale,
                                mask_kind=mask_kind, precision=precision)
        # Online softmax (FlashAttention-2, section 3.1): rescale the running sums to the new row maximum.
        m_prev = m_scratch[...]  # [G, bq, 1]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        correction = jnp.exp(m_prev - m_next)
        # Explicit zeroing: in a row with nothing visible yet, m_next is MASK_VALUE and exp(s - m) would be 1.
        p = jnp.where(mask, jnp.exp(s - m_next), 0.0)
        l_scratch[...] = correction * l_scratch[...] + jnp.sum(p, axis=-1, keepdims=True)
        v = v_ref[...]
        acc_scratch[...] = correction * acc_scratch[...] + stacked_dot(p.astype(v.dtype), v, precision)
        m_scratch[...] = m_next

    @pl.when(j == num_slots - 1)
    def _finish():
        row_sum = l_scratch[...]
        seen = row_sum > 0.0  # rows that saw no visible key (padding, empty segments) output zeros
        denom = jnp.where(seen, row_sum, 1.0)
        o_ref[...] = jnp.where(seen, acc_scratch[...] / denom, 0.0).astype(o_ref.dtype)
        # The backward's residual; 0 for unseen rows, whose probabilities it zeroes through the mask anyway.
        lse_ref[...] = jnp.where(seen, m_scratch[...] + jnp.log(denom), 0.0)


class QueryTileGrid(NamedTuple):
    """The grid of the forward and of the dq kernel: one program per (batch, KV head, query tile, visited key
    tile), its scalar-prefetched schedule, and the BlockSpecs of the tensors both read the same way."""

    grid: tuple[int, int, int, int]
    schedule: jax.Array
    counts: jax.Array
    q_spec: pl.BlockSpec  # [G, bq, D] of the G query heads of one KV head (q, out, dq, dO)
    row_spec: pl.BlockSpec  # [G, bq, 1] per-row residuals (lse, delta)
    kv_spec: pl.BlockSpec  # [bk, D] of the visited key tile
    meta_specs: tuple[pl.BlockSpec, pl.BlockSpec]  # the query tile's and key tile's mask data


def query_tile_grid(inputs: TpuInputs, static: TpuStatic) -> QueryTileGrid:
    B, H, T_pad, D = inputs.q.shape
    K, S_pad = inputs.k.shape[1], inputs.k.shape[2]
    group, bq, bk = H // K, static.block_q, static.block_k
    nq, nk = T_pad // bq, S_pad // bk
    schedule, counts = flat_schedule(inputs.visit)

    def key_tile(b, i, j, schedule_ref):
        return schedule_ref[(b * nq + i) * nk + j]

    # One program per KV head: its G query heads are block kh of the head axis, in units of G heads.
    return QueryTileGrid(
        grid=(B, K, nq, nk), schedule=schedule, counts=counts,
        q_spec=pl.BlockSpec((None, group, bq, D), lambda b, kh, i, j, *_: (b, kh, i, 0)),
        row_spec=pl.BlockSpec((None, group, bq, 1), lambda b, kh, i, j, *_: (b, kh, i, 0)),
        kv_spec=pl.BlockSpec((None, None, bk, D), lambda b, kh, i, j, s, _: (b, kh, key_tile(b, i, j, s), 0)),
        meta_specs=(pl.BlockSpec((None, bq, 4), lambda b, kh, i, j, *_: (b, i, 0)),
                    pl.BlockSpec((None, 4, bk), lambda b, kh, i, j, s, _: (b, 0, key_tile(b, i, j, s)))))


def forward_call(inputs: TpuInputs, static: TpuStatic):
    """The forward pallas_call on prepared inputs: (out [B, H, T', D] in q's dtype, lse [B, H, T', 1] float32)."""
    B, H, T_pad, D = inputs.q.shape
    group, bq = H // inputs.k.shape[1], static.block_q
    g = query_tile_grid(inputs, static)
    kernel = functools.partial(_forward_kernel, scale=static.scale, mask_kind=static.mask_kind,
                               precision=dot_precision(inputs.q.dtype))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=g.grid,
            in_specs=[g.q_spec, g.kv_spec, g.kv_spec, *g.meta_specs],
            out_specs=[g.q_spec, g.row_spec],
            scratch_shapes=[pltpu.VMEM((group, bq, 1), jnp.float32), pltpu.VMEM((group, bq, 1), jnp.float32),
                            pltpu.VMEM((group, bq, D), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(inputs.q.shape, inputs.q.dtype),
                   jax.ShapeDtypeStruct((B, H, T_pad, 1), jnp.float32)],
        name="jf_flash_attention_tpu",
        **compiler_params(static, ("parallel", "parallel", "parallel", "arbitrary")),
    )(g.schedule, g.counts, inputs.q, inputs.k, inputs.v, inputs.q_cols, inputs.k_rows)


@functools.partial(jax.jit, static_argnames=("static",))
def forward(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, static: TpuStatic):
    """out [B, T, H, D] and the residuals the backward needs: (out, lse [B, H, T', 1])."""
    out, lse = forward_call(prepare(q, k, v, q_meta, k_meta, static), static)
    return out.transpose(0, 2, 1, 3)[:, :q.shape[1]], lse
