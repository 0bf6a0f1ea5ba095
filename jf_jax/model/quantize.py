"""int8 weights and activations (W8A8) for decoding: a lossy approximation of the model, decoded losslessly.

Weights are quantised once, symmetrically per output channel: ``w[:, n] ~= data[:, n] * scale[n]`` with ``data``
int8 in [-127, 127]. Each matmul's input is quantised per row on the fly, ``x[m] ~= xq[m] * sx[m]``, and the
product is an exact int8 x int8 -> int32 dot (``cpu_kernels.int8_gemm``: an AVX512-VNNI kernel over weights packed
once at load, or XLA's dot), rescaled in float32: ``y[m, n] = acc[m, n] * sx[m] * scale[n]``.

Why it suits Jacobi decoding: integer sums are exact, so a row's result cannot depend on the summation order,
the number of rows or the kernel XLA picks; a row's quantisation reads only that row. An int8 token therefore
gets the same bits in a one-token AR step and inside a 16-token block: int8 jacobi == int8 AR by construction.
The int8 model itself differs from the bfloat16 one (quantisation error): its greedy tokens may differ from
bf16 AR's, and that is the documented price.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from cpu_kernels import PackedInt8, pack_int8, unpack_int8, w8a8_matmul
from cpu_kernels.int8_gemm import INT8_MAX



@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A weight ``w`` [*in_shape, *out_shape] as int8 values [K, N] (K = prod(in_shape), N = prod(out_shape)) with
    float32 per-output-channel scales, packed for ``cpu_kernels.w8a8_matmul``, for ``x @ w`` contracting x's
    trailing ``in_shape`` axes."""

    packed: PackedInt8
    in_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    out_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))


def quantize_weight(w, in_dims: int = 1) -> Int8Weight:
    """Symmetric per-output-channel int8 quantisation of ``w`` (its first ``in_dims`` axes contracted)."""
    in_shape, out_shape = tuple(w.shape[:in_dims]), tuple(w.shape[in_dims:])
    w2 = jnp.asarray(w, jnp.float32).reshape(math.prod(in_shape), math.prod(out_shape))
    scale = jnp.max(jnp.abs(w2), axis=0) / INT8_MAX
    scale = jnp.where(scale > 0, scale, 1.0)
    values = jnp.clip(jnp.round(w2 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return Int8Weight(packed=pack_int8(values, scale), in_shape=in_shape, out_shape=out_shape)


def dequantize_weight(q: Int8Weight, dtype=jnp.float32):
    """The weight [*in_shape, *out_shape] that ``q`` stands for (values * scale)."""
    values = unpack_int8(q.packed).astype(jnp.float32)
    return (values * q.packed.scale[: q.packed.n]).astype(dtype).reshape(q.in_shape + q.out_shape)


def int8_matmul(x, q: Int8Weight):
    """``x @ w`` for x [..., *in_shape] in float32 [..., *out_shape]: each row of x quantised to int8, an exact
    int32 product, rescaled (``cpu_kernels.w8a8_matmul``: the VNNI kernel, or its plain-JAX twin)."""
    lead = x.shape[: x.ndim - len(q.in_shape)]
    if x.shape[len(lead):] != q.in_shape:
        raise ValueError(f"int8_matmul: x's trailing axes {x.shape[len(lead):]} != the weight's {q.in_shape}")
    return w8a8_matmul(x.reshape(math.prod(lead), -1), q.packed).reshape(lead + q.out_shape)
