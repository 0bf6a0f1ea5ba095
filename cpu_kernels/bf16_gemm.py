"""The small-M bfloat16 GEMM of decode steps: XLA FFI custom calls for two instruction sets and their plain-JAX twin.

Why a kernel: XLA:CPU hands bf16 dots to YNNPACK, which re-packs the weight matrix on every call, so a decode
step streams each weight at ~9-13 GB/s; and a one-row dot goes to XLA's GEMV, which converts the whole bf16
weight to float32 first (~1.5 GB/s). The kernels read a weight packed once at load time in the register layout of
``_mm512_dpbf16_ps`` and stream it once per call, whatever the row count: the AVX-512 kernel (``bf16_gemm.cc``)
16 columns at a time, the AVX2 kernel (``bf16_gemm_avx2.cc``), for CPUs without AVX-512, 8. Both multiply in
float32 FMAs in one order, so they give the same bits, and rows never depend on each other (batch invariance, see
the .cc files). Both take x's bf16 values widened to float32 once, by XLA: their inner loops broadcast each value
straight from memory into a float32 register (one load, no widening per use).

``gemm`` runs the first kernel that runs here (``kernel_target``: built by ``python -m cpu_kernels.build``, a CPU
with the kernel's instructions, JAX on CPU) and ``gemm_reference`` otherwise: the same product through XLA's own
dot, equal to rounding (a test checks they agree); each keeps a row's bits whatever the row count (the model gives
XLA's dot row counts that do, ``jf_jax.model.weight_matmul.DotRows``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from cpu_kernels import library

TILE = 16  # output columns per AVX512 register of float32 lanes (two AVX2 registers)


@dataclasses.dataclass(frozen=True)
class GemmKernel:
    """One of the GEMM kernels: the set it is built in, and how it is called."""

    kernel_set: library.KernelSet
    target: str
    """Its FFI target."""


KERNELS = (GemmKernel(library.AVX512, "jf_bf16_gemm"), GemmKernel(library.AVX2, "jf_bf16_gemm_avx2"))
"""In order of preference."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """A weight ``w`` [*in_shape, *out_shape] held as bf16 [ceil(N/16), K/2, 16, 2] (K = prod(in_shape), N =
    prod(out_shape)), for ``x @ w`` contracting x's trailing ``in_shape`` axes."""

    data: jax.Array
    in_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    out_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))

    @property
    def k(self) -> int:
        return math.prod(self.in_shape)

    @property
    def n(self) -> int:
        return math.prod(self.out_shape)


def pack_weight(w, in_dims: int = 1) -> PackedWeight:
    """Packs ``w`` (its first ``in_dims`` axes contracted) for ``gemm``; N is zero-padded to a multiple of 16."""
    in_shape, out_shape = tuple(w.shape[:in_dims]), tuple(w.shape[in_dims:])
    K, N = math.prod(in_shape), math.prod(out_shape)
    if K % 2:
        raise ValueError(f"the packed GEMM needs an even contraction size, got {K}")
    NT = -(-N // TILE)
    w2 = jnp.pad(jnp.asarray(w, jnp.bfloat16).reshape(K, N), ((0, 0), (0, NT * TILE - N)))
    data = w2.reshape(K // 2, 2, NT, TILE).transpose(2, 0, 3, 1)
    return PackedWeight(data=data, in_shape=in_shape, out_shape=out_shape)


def unpack_weight(p: PackedWeight):
    """The bf16 weight [*in_shape, *out_shape] that ``p`` packs."""
    NT, KP = p.data.shape[:2]
    w2 = p.data.transpose(1, 3, 0, 2).reshape(2 * KP, NT * TILE)[:, : p.n]
    return w2.reshape(p.in_shape + p.out_shape)


def _flat(x, p: PackedWeight):
    lead = x.shape[: x.ndim - len(p.in_shape)]
    if x.shape[len(lead):] != p.in_shape:
        raise ValueError(f"x {x.shape} does not end in the weight's input shape {p.in_shape}")
    return lead, x.reshape((math.prod(lead), p.k)).astype(jnp.bfloat16)


def gemm_reference(x, p: PackedWeight):
    """``x @ w`` in float32 through XLA's own dot (the plain-JAX semantics of ``gemm``)."""
    lead, x2 = _flat(x, p)
    w2 = unpack_weight(p).reshape(p.k, p.n)
    return jnp.einsum("mk,kn->mn", x2, w2, preferred_element_type=jnp.float32).reshape(lead + p.out_shape)


def kernel_target() -> str | None:
    """The FFI target of the GEMM kernel this process runs (None: none runs here, ``gemm`` is ``gemm_reference``)."""
    return next((k.target for k in KERNELS if library.available(k.kernel_set)), None)


def gemm_kernel(x, p: PackedWeight, target: str):
    """``x @ w`` in float32 through the kernel ``target`` (one of ``KERNELS``; its set must be available)."""
    lead, x2 = _flat(x, p)
    x2 = x2.astype(jnp.float32)  # bf16 values (``_flat``), widened once
    rows = x2.shape[0]
    out = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, p.data.shape[0] * TILE), jnp.float32),
                           vmap_method="broadcast_all")(x2, p.data)
    return out[:, : p.n].reshape(lead + p.out_shape)


def gemm(x, p: PackedWeight):
    """``x @ w`` in float32 (x cast to bf16, contracting its trailing ``p.in_shape`` axes): the kernel of
    ``kernel_target`` when one runs here, else ``gemm_reference``."""
    target = kernel_target()
    return gemm_reference(x, p) if target is None else gemm_kernel(x, p, target)
