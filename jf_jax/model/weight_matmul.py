"""``x @ w`` for every form a matmul weight takes, and the dots underneath.

A weight reaches a matmul as ``Shards`` (one weight split along its output axis, a 1-tuple when unsplit: the
stacked training layout and the column-sharded decode view) or prepared at load time (``model.decode_view``):
packed for ``cpu_kernels.gemm`` (bfloat16) or quantised (``model.quantize``, int8). ``matmul`` is the one place
that tells these forms apart; every projection of ``model.transformer``, the output head included, goes through it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from cpu_kernels import PackedWeight, bf16_gemm, gemm, library
from jf_jax.model.decode_view import Shards
from jf_jax.model.quantize import Int8Weight, int8_matmul

# How XLA:CPU's dots of a compute dtype keep one summation order per row (measured, jax 0.10.2, YNNPACK dots;
# tests/test_dot_rows.py checks it on this machine). One-row dots differ in every dtype (a GEMV). Float32 dots change
# order past 32 rows (33-48 and 64+ differ from 2-32). Bfloat16 dots keep one order at every row count >= 2 on the
# AVX2 and AVX512-BF16 CPUs measured; on a CPU with AMX a two-row dot differs too, and a dot with few outputs
# (<= 128 columns) runs its rows in chunks of 64, a last chunk of one or two rows with the other kernels. So a
# decode forward pads its rows up to ``fewest`` and runs more than ``tile`` rows in tiles of exactly ``tile``.
# Bfloat16 is tiled on every CPU: the chunking was seen on AMX only, but a tile costs a loop, not arithmetic.
ROW_TILES = {"float32": 32, "bfloat16": 64}


@dataclasses.dataclass(frozen=True)
class DotRows:
    """The row counts a decode forward gives its dots, so that a row's bits never depend on how many rows share
    its dot: fewer than ``fewest`` rows are padded up to it, more than ``tile`` run in tiles of ``tile`` rows."""

    fewest: int
    tile: int | None


def dot_rows(dtype: str, backend: str, cpu_flags: frozenset[str] | None) -> DotRows:
    """``DotRows`` for decoding in ``dtype`` on ``backend``; a CPU's feature flags decide its bfloat16 rows (unknown
    flags, as off Linux, count as AMX: a third row costs little). Off the CPU, fixed decode shapes
    (``decoding.shapes``) keep rows invariant, so bfloat16 dots run untiled there (a tile is a sequential loop);
    float32 keeps its tiles, as in the H100 runs that showed float32 decoding lossless."""
    if backend != "cpu":
        return DotRows(2, ROW_TILES["float32"] if dtype == "float32" else None)
    amx = cpu_flags is None or "amx_bf16" in cpu_flags
    return DotRows(3 if dtype == "bfloat16" and amx else 2, ROW_TILES.get(dtype))


@functools.cache
def this_machine_dot_rows(dtype: str) -> DotRows:
    """``dot_rows`` of this process's default backend and CPU."""
    return dot_rows(dtype, jax.default_backend(), library.cpu_flags())


# How each weight prepared at load time multiplies: float32 ``x @ w`` contracting x's trailing axes with the
# weight's input axes (the prepared forms carry their own shapes, so no equation is needed).
PREPARED_MATMULS: dict[type, Callable] = {PackedWeight: gemm, Int8Weight: int8_matmul}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def mixed_einsum(equation: str, x, w):
    """``einsum(equation, x, w)`` with w cast to x's dtype, accumulated in float32, whose backward runs its dots
    in x's dtype too.

    A bfloat16 forward dot returns float32, so its cotangent is float32 and autodiff's backward dots would run
    in float32 (measured: no faster than a float32 model). Here the cotangent is cast to x's dtype first, as
    mixed-precision training does: both backward dots take bf16 operands (YNNPACK's fast kernels) and still
    accumulate in float32, and the weight gradient is returned in w's own dtype (float32 master weights get an
    unrounded float32 gradient). Every index of ``equation`` must appear in exactly two of its three terms
    (true of the model's projections).
    """
    return jnp.einsum(equation, x, w.astype(x.dtype), preferred_element_type=jnp.float32)


def _mixed_einsum_fwd(equation, x, w):
    return mixed_einsum(equation, x, w), (x, w)


def _mixed_einsum_bwd(equation, residuals, g):
    x, w = residuals
    ins, out = equation.split("->")
    x_sub, w_sub = ins.split(",")
    g = g.astype(x.dtype)
    dx = jnp.einsum(f"{out},{w_sub}->{x_sub}", g, w.astype(x.dtype), preferred_element_type=jnp.float32)
    if x.ndim == 2:
        # The weight gradient contracts both operands' leading (row) axis. XLA:CPU runs that dot in float32 when
        # the operands are 2-D (both converted first), but transposes bf16 operands of 3 or more dimensions and
        # hands them to YNNPACK: a unit axis picks the fast path (the tied LM head's gradient, "nd,nv->vd", the
        # one such dot in a train step and its largest: 597 -> 325 ms, experiments/bench_weight_grad.py).
        unit = next(c for c in "zyxwuts" if c not in equation)
        x, g, x_sub, out = x[None], g[None], unit + x_sub, unit + out
    dw = jnp.einsum(f"{x_sub},{out}->{w_sub}", x, g, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def _in_row_tiles(dot: Callable, x, lead: int, tile: int | None):
    """``dot(x, lead)`` (a product of x's rows, its ``lead`` leading axes); with more than ``tile`` rows, computed
    in groups of exactly ``tile`` rows (a ``lax.map`` over x's rows flattened, the last group padded) as
    ``dot(group, 1)``, so a row's bits never depend on how many rows there are."""
    rows = math.prod(x.shape[:lead])
    if tile is None or rows <= tile:
        return dot(x, lead)
    groups = -(-rows // tile)
    flat = x.reshape((rows,) + x.shape[lead:])
    flat = jnp.pad(flat, [(0, groups * tile - rows)] + [(0, 0)] * (flat.ndim - 1))
    out = jax.lax.map(lambda t: dot(t, 1), flat.reshape((groups, tile) + flat.shape[1:]))
    out = out.reshape((groups * tile,) + out.shape[2:])[:rows]
    return out.reshape(x.shape[:lead] + out.shape[1:])


def _shard_dot(equation: str, w, lead: int) -> Callable:
    """``dot(x, n)`` of ``_in_row_tiles`` for one weight shard: ``mixed_einsum`` with ``equation``, or with x's
    ``lead`` row axes flattened into one (n == 1)."""
    ins, out = equation.split("->")
    x_sub, w_sub = ins.split(",")
    flat = f"m{x_sub[lead:]},{w_sub}->m{out[lead:]}"
    return lambda x, n: mixed_einsum(equation if n == lead else flat, x, w)


def matmul(equation: str, x, w: Shards | PackedWeight | Int8Weight, dtype, row_tile: int | None = None,
           lead: int = 2):
    """``einsum(equation, x, w)`` accumulated in float32, whatever form ``w`` takes.

    ``equation`` names x's ``lead`` row axes first; ``row_tile`` (``DotRows.tile``) bounds the rows of one product.
    A prepared weight (``PREPARED_MATMULS``) multiplies x as given; the kernels' rows are independent and int8's
    sums exact, so only packed weights when no GEMM kernel runs (``bf16_gemm.kernel_target()`` is None: XLA's dot,
    ``gemm_reference``) are tiled.
    ``Shards`` multiply x cast to ``dtype``, one dot per shard, concatenated back: the shards' dots are independent,
    so XLA's CPU runtime runs them on different cores (a one-token step is a chain of matrix-vector products, and
    one XLA dot runs on a single core).
    """
    prepared = PREPARED_MATMULS.get(type(w))
    if prepared is not None:
        through_xla_dot = isinstance(w, PackedWeight) and bf16_gemm.kernel_target() is None
        return _in_row_tiles(lambda t, n: prepared(t, w), x, lead, row_tile if through_xla_dot else None)
    outs = [_in_row_tiles(_shard_dot(equation, s, lead), x.astype(dtype), lead, row_tile) for s in w]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-1)
