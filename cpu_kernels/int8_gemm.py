"""The W8A8 matmul of decode steps: an XLA FFI custom call (``int8_gemm.cc``) and its plain-JAX twin.

``w8a8_matmul(x, p)`` quantises each row of x to int8 (symmetric, ``quantize_rows``), multiplies by the int8
weight exactly in int32, and rescales by the row's and the output channel's scales. Why a kernel: XLA:CPU's
s8 x s8 -> s32 dot re-packs the weight on every call, and the quantise / rescale ops around it cost more than
the dot (measured on the 2-core dev machine, 576x3072 weight at 2 rows: XLA's int8 dot 210 us, quantise + dot +
rescale in XLA 160 us with the kernel's dot alone at 40 us). The kernel reads the weight packed once at load in
the register layout of ``_mm512_dpbusd_epi32`` (AVX512-VNNI), with 128 * its column sums beside it (it feeds
x + 128 as unsigned bytes), and does the quantising and rescaling itself with the twin's float operations.

``w8a8_matmul`` runs the kernel when ``library.available()`` and ``w8a8_reference`` otherwise: the same bits
(integer sums are exact; the float steps are the same operations in the same order; a test checks).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from cpu_kernels import library

TILE = 16  # output columns per AVX512 register of int32 lanes
GROUP = 4  # k per int32 lane of _mm512_dpbusd_epi32
INT8_MAX = 127.0
# Scales are max|x| * (1/127), a multiplication: XLA rewrites a division by a constant into one (with a rounded
# reciprocal), and the kernel must do the very same float operation.
INV_INT8_MAX = 1.0 / 127.0
TARGETS = {jnp.dtype(jnp.bfloat16): "jf_w8a8_bf16", jnp.dtype(jnp.float32): "jf_w8a8_f32"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedInt8:
    """An int8 weight [K, N] with float32 per-output-channel scales, for ``x @ (values * scale)``: ``data``
    [ceil(N/16), K/4, 16, 4] int8 (N zero-padded), ``bias`` = 128 * column sums and ``scale`` (padded with 1), both
    [ceil(N/16) * 16]."""

    data: jax.Array
    bias: jax.Array
    scale: jax.Array
    n: int = dataclasses.field(metadata=dict(static=True))

    @property
    def k(self) -> int:
        return self.data.shape[1] * GROUP


def pack_int8(values, scale) -> PackedInt8:
    """Packs int8 ``values`` [K, N] (K a multiple of 4) and their output-channel ``scale`` [N] for ``w8a8_matmul``."""
    K, N = values.shape
    if K % GROUP:
        raise ValueError(f"the int8 GEMM needs a contraction size that is a multiple of {GROUP}, got {K}")
    NT = -(-N // TILE)
    w2 = jnp.pad(jnp.asarray(values, jnp.int8), ((0, 0), (0, NT * TILE - N)))
    return PackedInt8(data=w2.reshape(K // GROUP, GROUP, NT, TILE).transpose(2, 0, 3, 1),
                      bias=128 * jnp.sum(w2.astype(jnp.int32), axis=0),
                      scale=jnp.pad(jnp.asarray(scale, jnp.float32), (0, NT * TILE - N), constant_values=1.0), n=N)


def unpack_int8(p: PackedInt8):
    """The int8 values [K, N] that ``p`` packs."""
    NT, KQ = p.data.shape[:2]
    return p.data.transpose(1, 3, 0, 2).reshape(KQ * GROUP, NT * TILE)[:, : p.n]


def quantize_rows(x2):
    """Per-row symmetric int8 quantisation of x2 [M, K]: (xq int8 [M, K], scale float32 [M]) with
    scale = max|x| * float32(1/127) (1 for a zero row) and xq = clip(round_half_even(x / scale), -127, 127)."""
    x2 = x2.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x2), axis=-1) * jnp.float32(INV_INT8_MAX)
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(x2 / scale[:, None]), -INT8_MAX, INT8_MAX).astype(jnp.int8), scale


def w8a8_reference(x2, p: PackedInt8):
    """The plain-JAX semantics of ``w8a8_matmul``: x2 [M, K] (float32 or bf16) -> float32 [M, N]."""
    xq, sx = quantize_rows(x2)
    acc = jax.lax.dot_general(xq, unpack_int8(p), (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * sx[:, None] * p.scale[None, : p.n]


def w8a8_matmul(x2, p: PackedInt8):
    """x2 [M, K] quantised per row, times the int8 weight, rescaled: float32 [M, N]; the kernel when
    ``available()``, else ``w8a8_reference``."""
    if x2.ndim != 2 or x2.shape[1] != p.k:
        raise ValueError(f"w8a8_matmul: x must be [M, {p.k}], got {x2.shape}")
    dtype = jnp.dtype(x2.dtype) if jnp.dtype(x2.dtype) in TARGETS else jnp.dtype(jnp.float32)
    if not library.available():
        return w8a8_reference(x2, p)
    out = jax.ffi.ffi_call(TARGETS[dtype], jax.ShapeDtypeStruct((x2.shape[0], p.data.shape[0] * TILE), jnp.float32),
                           vmap_method="broadcast_all")(x2.astype(dtype), p.data, p.bias, p.scale)
    return out[:, : p.n]
