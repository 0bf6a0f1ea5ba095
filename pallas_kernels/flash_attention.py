"""Flash attention with the per-token Jacobi Forcing mask, skipping fully masked tiles (Pallas): the entry point
``attention``, and its Triton forward kernel; its fused backward is ``triton_attention_backward``. The TPU (Mosaic)
kernels are ``tpu_attention`` and ``tpu_attention_backward``.

Same signature and semantics as ``attention_reference``: q [B, T, H, D], k/v [B, S, K, D] (GQA, H a multiple
of K), per-token ``TokenMeta`` for queries and keys, float32 softmax, zero output rows for queries that may
attend nothing. Layers:

1. *Tile schedule* (plain JAX, in the wrapper; ``schedule.py``). Each query/key tile is summarised per
   stream (context, noisy, clean) by the min/max of its valid tokens' position, block and segment. A
   conservative tile-level version of ``mask.allowed`` over those intervals says which (query tile, key tile)
   pairs may hold a visible pair; the visited key tiles of each query tile are compacted into a list. Skipped
   tiles are never loaded nor computed: the kernel's key loop runs over the list only. Per stream, positions
   grow with the block index in every layout we build, so the test is exact for them (not merely
   conservative); see the tests.
2. *Kernel* (``_flash_kernel``): one program per (batch, head, query tile); online softmax in float32 over
   the visited key tiles, evaluating ``mask.allowed`` elementwise from per-token data inside each tile. It also
   writes each row's log-sum-exp, the backward's O(T) residual.
3. ``attention``: pads lengths to the tiles (padding tokens get segment -1: never visible, zero rows) and the
   head dim to a power of two, picks tiles from ``tuning``, and runs on Triton (GPU) or in Pallas interpret
   mode (chosen automatically on CPU). A ``jax.custom_vjp`` gives the backward: on either path fused dq and dk/dv
   kernels that recompute the probabilities from the log-sum-exp (O(T) memory per head); ``backward="reference"``
   differentiates the reference instead (O(T*S) per head: the semantics, and a fallback).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.attention_reference import attention_reference, check_attention_shapes
from pallas_kernels.mask import MASK_KINDS, MASK_NOISE_CONDITIONED, TokenMeta, allowed
# The tile schedule lives in its own module (the TPU kernels share it); re-exported here, where callers found it.
from pallas_kernels.schedule import (TileSummary, pad_meta, round_up, tile_schedule, tile_sparsity,  # noqa: F401
                                     tile_summary, tile_visit_mask)
from pallas_kernels.tuning import BlockSizes, block_sizes_for, tpu_block_sizes

BACKENDS = ("triton", "tpu")
BACKWARDS = ("fused", "reference")
# Finite (not -inf) so that exp(s - m) never sees inf - inf; masked probabilities are zeroed explicitly.
_MASK_VALUE = -1e30


# ----------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------

def _flash_kernel(schedule_ref, q_ref, k_ref, v_ref, q_meta_ref, k_meta_ref, o_ref, lse_ref, *, scale: float,
                  block_k: int, mask_kind: str, precision):
    """One (batch, head, query tile). Refs: schedule [nk'], q [bq, D], k/v [S, D], q-meta [4, bq],
    k-meta [4, S] (TokenMeta fields stacked), out [bq, D], lse [bq]."""
    block_q, head_dim = q_ref.shape
    schedule = schedule_ref[...]
    num_visits = jnp.sum((schedule >= 0).astype(jnp.int32))
    lanes = lax.broadcasted_iota(jnp.int32, schedule.shape, 0)

    q = q_ref[...]  # stays in registers / shared memory for the whole key loop
    # Field rows are read from the refs (Triton cannot slice a loaded tensor).
    q_meta = TokenMeta(*(q_meta_ref[i, :][:, None] for i in range(4)))  # fields [bq, 1]

    def body(t, carry):
        acc, m_prev, l_prev = carry
        # Element t of the schedule, read as a masked reduction: a vector op every backend lowers.
        tile = jnp.sum(jnp.where(lanes == t, schedule, 0))
        keys = pl.ds(pl.multiple_of(tile * block_k, block_k), block_k)
        k = k_ref[keys, :]  # [bk, D]
        k_meta = TokenMeta(*(k_meta_ref[i, keys][None, :] for i in range(4)))  # fields [1, bk]
        mask = allowed(q_meta, k_meta, mask_kind)  # [bq, bk]
        s = jnp.dot(q, k.T, precision=precision, preferred_element_type=jnp.float32) * scale
        s = jnp.where(mask, s, _MASK_VALUE)
        # Online softmax (FlashAttention-2, section 3.1): rescale the running sums to the new row maximum.
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1))
        correction = jnp.exp(m_prev - m_next)
        # Explicit zeroing: in a row with nothing visible yet, m_next is _MASK_VALUE and exp(s - m) would be 1.
        p = jnp.where(mask, jnp.exp(s - m_next[:, None]), 0.0)
        l_next = correction * l_prev + jnp.sum(p, axis=-1)
        v = v_ref[keys, :]
        pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        return correction[:, None] * acc + pv, m_next, l_next

    init = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.full((block_q,), _MASK_VALUE, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    acc, row_max, row_sum = lax.fori_loop(0, num_visits, body, init)
    # Rows that saw no visible key (padding, empty segments, empty schedules) have row_sum == 0: output zeros.
    seen = row_sum > 0.0
    denom = jnp.where(seen, row_sum, 1.0)
    o_ref[...] = jnp.where(seen[:, None], acc / denom[:, None], 0.0).astype(o_ref.dtype)
    # The backward's residual; 0 for unseen rows, whose probabilities it zeroes through the mask anyway.
    lse_ref[...] = jnp.where(seen, row_max + jnp.log(denom), 0.0)


# ----------------------------------------------------------------------------------------------------------
# Wrapper
# ----------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything the jitted forward specialises on (hashable, passed as a static argument)."""

    mask_kind: str
    scale: float
    block_sizes: BlockSizes
    interpret: bool
    backend: str
    backward: str = "fused"


def _dot_precision(dtype):
    """Precision of the forward kernel's and the backward's dots: float32 inputs get full-precision dots, since
    Triton and XLA:GPU otherwise use TF32 on Ampere and later (it put 2.6e-3 into float32 gradients on an H100,
    results/studies/gpu_h100/2026-11-24/kernel_tests.txt); other dtypes keep the default."""
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


@functools.partial(jax.jit, static_argnames=("static",))
def _forward(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, static: _Static):
    """out [B, T, H, D] and the log-sum-exp of each row, [B, H, T] float32 (the backward's residual)."""
    B, T, H, D = q.shape
    S, K = k.shape[1], k.shape[2]
    group = H // K
    # Shrink tiles for short inputs (a decode block of 16 queries should not pay for a 128-row tile).
    block_q = min(static.block_sizes.block_q, max(16, pl.next_power_of_2(T)))
    block_k = min(static.block_sizes.block_k, max(16, pl.next_power_of_2(S)))
    T_pad, S_pad = round_up(T, block_q), round_up(S, block_k)
    # Zero-padding the head dim changes no dot product; Triton needs power-of-two dims of at least 16.
    D_pad = max(16, pl.next_power_of_2(D))
    q = jnp.pad(q, ((0, 0), (0, T_pad - T), (0, 0), (0, D_pad - D)))
    k = jnp.pad(k, ((0, 0), (0, S_pad - S), (0, 0), (0, D_pad - D)))
    v = jnp.pad(v, ((0, 0), (0, S_pad - S), (0, 0), (0, D_pad - D)))
    q_meta, k_meta = pad_meta(q_meta, T_pad), pad_meta(k_meta, S_pad)

    schedule = tile_schedule(tile_visit_mask(q_meta, k_meta, block_q, block_k, static.mask_kind))
    num_q_tiles, schedule_len = schedule.shape[1], schedule.shape[2]

    precision = _dot_precision(q.dtype)
    kernel = functools.partial(_flash_kernel, scale=static.scale, block_k=block_k,
                               mask_kind=static.mask_kind, precision=precision)
    q_spec = pl.BlockSpec((None, block_q, None, D_pad), lambda b, h, i: (b, i, h, 0))
    kv_spec = pl.BlockSpec((None, S_pad, None, D_pad), lambda b, h, i: (b, 0, h // group, 0))
    # The four TokenMeta fields travel stacked as [B, 4, N] int32: one small load per tile instead of four.
    in_specs = [pl.BlockSpec((None, None, schedule_len), lambda b, h, i: (b, i, 0)), q_spec, kv_spec, kv_spec,
                pl.BlockSpec((None, 4, block_q), lambda b, h, i: (b, 0, i)),
                pl.BlockSpec((None, 4, S_pad), lambda b, h, i: (b, 0, 0))]
    compiler_params = None
    if not static.interpret:
        from jax.experimental.pallas import triton as plgpu  # GPU-only import, kept out of CPU paths

        compiler_params = plgpu.CompilerParams(num_warps=static.block_sizes.num_warps,
                                               num_stages=static.block_sizes.num_stages)
    out, lse = pl.pallas_call(
        kernel,
        grid=(B, H, num_q_tiles),
        in_specs=in_specs,
        out_specs=[q_spec, pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, H, T_pad), jnp.float32)],
        compiler_params=compiler_params,
        interpret=static.interpret,
        name="jf_flash_attention",
    )(schedule, q, k, v, jnp.stack(q_meta, axis=1), jnp.stack(k_meta, axis=1))
    return out[:, :T, :, :D], lse[:, :, :T]


def _tpu_static(q, k, static: _Static):
    from pallas_kernels import tpu_attention  # imported on demand, like the Triton module on the GPU path

    block_q, block_k = tpu_attention.tile_sizes(static.block_sizes.block_q, static.block_sizes.block_k,
                                                q.shape[1], k.shape[1])
    return tpu_attention.TpuStatic(static.mask_kind, static.scale, block_q, block_k, static.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, q_meta, k_meta, static: _Static):
    return _attention_fwd(q, k, v, q_meta, k_meta, static)[0]


def _attention_fwd(q, k, v, q_meta, k_meta, static: _Static):
    if static.backend == "tpu":
        from pallas_kernels import tpu_attention

        out, lse = tpu_attention.forward(q, k, v, q_meta, k_meta, _tpu_static(q, k, static))
    else:
        out, lse = _forward(q, k, v, q_meta, k_meta, static)
    # O(T) residuals: the fused backwards recompute the probabilities from the log-sum-exp.
    return out, (q, k, v, q_meta, k_meta, out, lse)


@functools.partial(jax.jit, static_argnames=("mask_kind", "scale"))
def _reference_grads(q, k, v, q_meta, k_meta, d_out, *, mask_kind: str, scale: float):
    precision = _dot_precision(q.dtype)  # the forward's: JAX's default made this backward TF32 on an H100
    _, vjp = jax.vjp(lambda q, k, v: attention_reference(q, k, v, q_meta, k_meta, mask_kind=mask_kind,
                                                         scale=scale, precision=precision), q, k, v)
    return vjp(d_out)


def _attention_bwd(static: _Static, residuals, d_out):
    q, k, v, q_meta, k_meta, out, lse = residuals
    if static.backward == "reference":
        # Differentiate the reference (which defines the semantics): exact, but memory O(T*S) per head.
        dq, dk, dv = _reference_grads(q, k, v, q_meta, k_meta, d_out, mask_kind=static.mask_kind,
                                      scale=static.scale)
    elif static.backend == "tpu":
        from pallas_kernels import tpu_attention_backward

        dq, dk, dv = tpu_attention_backward.backward(q, k, v, q_meta, k_meta, out, lse, d_out,
                                                     _tpu_static(q, k, static))
    else:
        from pallas_kernels import triton_attention_backward

        dq, dk, dv = triton_attention_backward.backward(
            q, k, v, q_meta, k_meta, out, lse, d_out, mask_kind=static.mask_kind, scale=static.scale,
            block_sizes=static.block_sizes, interpret=static.interpret, precision=_dot_precision(q.dtype))
    no_grad = lambda meta: TokenMeta(*(np.zeros(f.shape, jax.dtypes.float0) for f in meta))  # noqa: E731
    return dq, dk, dv, no_grad(q_meta), no_grad(k_meta)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *, mask_kind: str = MASK_NOISE_CONDITIONED,
              scale: float | None = None, block_sizes: BlockSizes | None = None, interpret: bool | None = None,
              backend: str | None = None, backward: str = "fused"):
    """Masked GQA attention, flash-style with masked tiles skipped; semantics of ``attention_reference``.

    q: [B, T, H, D]; k, v: [B, S, K, D]; q_meta fields [B, T], k_meta fields [B, S] (int32). Returns
    [B, T, H, D] in q's dtype. ``block_sizes``: tiles (default: ``tuning.block_sizes_for`` the first device; with
    ``backend="tpu"``, ``tuning.tpu_block_sizes``, tiles Mosaic accepts at every length). Tiles given explicitly
    are used as given, and the compiled TPU kernel refuses illegal ones with a message naming the tile.
    ``interpret``: run the kernel in Pallas interpret mode (default: when JAX's default backend is CPU); with
    ``backend="tpu"`` that is the TPU interpret mode (``pltpu.InterpretParams``), which simulates the TPU's grid,
    scalar prefetch and VMEM scratch on the host.
    ``backend``: "triton" (the GPU kernels, ``_flash_kernel`` and ``triton_attention_backward``) or "tpu" (the
    Mosaic kernels of ``tpu_attention`` and ``tpu_attention_backward``). Default: "tpu" when JAX's default backend
    is a TPU, else "triton".
    ``backward``: "fused" (the backend's dq and dk/dv kernels, O(T) memory per head) or "reference" (autodiff of
    ``attention_reference``, O(T*S) per head: a fallback should a fused backward not compile on some device).
    """
    check_attention_shapes(q, k, v, q_meta, k_meta)
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {mask_kind!r}; expected one of {MASK_KINDS}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype} (shapes {q.shape}, {k.shape})")
    if interpret is None:
        # interpret=False off the device is allowed on purpose: it lets jax.export lower either kernel on a CPU host.
        interpret = jax.default_backend() == "cpu"
    if backend is None:
        backend = "tpu" if jax.default_backend() == "tpu" else "triton"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backward not in BACKWARDS:
        raise ValueError(f"unknown backward {backward!r}; expected one of {BACKWARDS}")
    if block_sizes is None:
        # TPU: the same tiles compiled or interpreted, legal for Mosaic at any length (tuning.tpu_block_sizes).
        block_sizes = tpu_block_sizes() if backend == "tpu" else block_sizes_for()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q_meta = TokenMeta(*(jnp.asarray(f, jnp.int32) for f in q_meta))
    k_meta = TokenMeta(*(jnp.asarray(f, jnp.int32) for f in k_meta))
    return _attention(q, k, v, q_meta, k_meta,
                      _Static(mask_kind, scale, block_sizes, bool(interpret), backend, backward))
