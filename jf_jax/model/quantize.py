"""int8 weights and activations (W8A8) for decoding: a lossy approximation of the model, decoded losslessly.

Weights are quantised once, symmetrically per output channel: ``w[:, n] ~= data[:, n] * scale[n]`` with ``data``
int8 in [-127, 127]. Each matmul's input is quantised per row on the fly, ``x[m] ~= xq[m] * sx[m]``, and the
product is an int8 x int8 -> int32 dot (XLA:CPU runs it on YNNPACK's int8 kernels for two rows or more), rescaled
in float32: ``y[m, n] = acc[m, n] * sx[m] * scale[n]``.

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

INT8_MAX = 127.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A weight ``w`` [*in_shape, *out_shape] as int8 ``data`` [K, N] (K = prod(in_shape), N = prod(out_shape))
    and float32 per-output-channel ``scale`` [N], for ``x @ w`` contracting x's trailing ``in_shape`` axes."""

    data: jax.Array
    scale: jax.Array
    in_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    out_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))


def quantize_weight(w, in_dims: int = 1) -> Int8Weight:
    """Symmetric per-output-channel int8 quantisation of ``w`` (its first ``in_dims`` axes contracted)."""
    in_shape, out_shape = tuple(w.shape[:in_dims]), tuple(w.shape[in_dims:])
    w2 = jnp.asarray(w, jnp.float32).reshape(math.prod(in_shape), math.prod(out_shape))
    scale = jnp.max(jnp.abs(w2), axis=0) / INT8_MAX
    scale = jnp.where(scale > 0, scale, 1.0)
    data = jnp.clip(jnp.round(w2 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return Int8Weight(data=data, scale=scale, in_shape=in_shape, out_shape=out_shape)


def dequantize_weight(q: Int8Weight, dtype=jnp.float32):
    """The weight [*in_shape, *out_shape] that ``q`` stands for (``data * scale``)."""
    return (q.data.astype(jnp.float32) * q.scale).astype(dtype).reshape(q.in_shape + q.out_shape)


def quantize_rows(x2):
    """Per-row symmetric int8 quantisation of x2 [M, K]: (xq int8 [M, K], scale float32 [M]); a zero row gets
    scale 1 and zeros."""
    x2 = x2.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x2), axis=-1) / INT8_MAX
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(x2 / scale[:, None]), -INT8_MAX, INT8_MAX).astype(jnp.int8), scale


def int8_matmul(x, q: Int8Weight):
    """``x @ w`` for x [..., *in_shape] in float32 [..., *out_shape]: x quantised per row, an exact int32 dot."""
    lead = x.shape[: x.ndim - len(q.in_shape)]
    if x.shape[len(lead):] != q.in_shape:
        raise ValueError(f"int8_matmul: x's trailing axes {x.shape[len(lead):]} != the weight's {q.in_shape}")
    xq, sx = quantize_rows(x.reshape(math.prod(lead), -1))
    acc = jax.lax.dot_general(xq, q.data, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    out = acc.astype(jnp.float32) * sx[:, None] * q.scale[None, :]
    return out.reshape(lead + q.out_shape)
