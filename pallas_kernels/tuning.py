"""Tile sizes of the flash-attention kernel, kept as data per device kind.

The kernel reads its tiles from here rather than hard-coding them (as openxla/tokamax does: tuned
values per device as data). Keys are substrings matched case-insensitively against ``jax.Device.device_kind``
("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "TPU v5 lite", "cpu", ...), in table order, so list specific
names first.

Provenance: none of the GPU rows has been autotuned in this project (no GPU was available when they were
written). They are the starting points used by the Triton fused-attention tutorial and JAX's Pallas GPU
attention for head_dim 64-128 (block_q 128 with block_k 64 on Ampere, deeper pipelines and 8 warps on
Hopper/Blackwell, whose larger shared memory and register file hold a 128x128 tile). Replace a row with
measured values from ``experiments/bench_attention.py --tiles ...`` (a sweep) when a GPU is at hand.

Tile size also sets how finely masked regions are skipped: the packed Jacobi Forcing layout is made of
n-token blocks (n = 16..64), so tiles much larger than n see mixed noisy/clean content and skip less
(see pallas_kernels/README.md for the measured fractions).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockSizes:
    """Tiles and launch parameters of the forward kernel (hashable: it is a static argument of the jit)."""

    block_q: int
    """Query rows per program (one program = one (batch, head, query tile))."""
    block_k: int
    """Key rows per inner-loop step; the unit at which fully masked work is skipped."""
    num_warps: int = 4
    """Triton: warps per program."""
    num_stages: int = 2
    """Triton: software-pipelining depth of the key loop."""

    def __post_init__(self):
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            # Triton tensors must have power-of-two shapes, and tl.dot needs at least 16 rows/columns.
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value!r}")
        if self.num_warps <= 0 or self.num_stages <= 0:
            raise ValueError(f"num_warps and num_stages must be positive, got {self.num_warps}, {self.num_stages}")


# Device-kind substring -> tiles. First match wins; "default" is the fallback. Measured on an H100 (2026-11-24,
# results/studies/gpu_h100/README.md): 128x64 at 3 stages ran, 2.9-5.7x dense masked attention in bf16; 128x128 at
# 3 stages asked for 233,472 bytes of shared memory at head dim 128, over the 232,448 a block may have. The H200
# and the B200 allow the same ~227 KB per block, so they take the tiles that ran rather than 128x128. On two lent
# H100s (2026-11-24 and -25), 128x32 beat 128x64 in all four side-by-side runs (the paper's packing at 768 and
# 3,072 tokens: 3-17% less time): the Hopper rows take it; the B200 keeps the tiles that ran on a Hopper card.
TILE_SIZES: dict[str, BlockSizes] = {
    "B200": BlockSizes(block_q=128, block_k=64, num_warps=8, num_stages=3),
    "H200": BlockSizes(block_q=128, block_k=32, num_warps=8, num_stages=3),
    "H100": BlockSizes(block_q=128, block_k=32, num_warps=8, num_stages=3),
    "A100": BlockSizes(block_q=128, block_k=64, num_warps=4, num_stages=3),
    # TPUs, by jax.Device.device_kind: "TPU v4", "TPU v5 lite" (v5e), "TPU v5" or "TPU v5p" (v5p), "TPU v6 lite"
    # (v6e); the v5e row comes before the v5p one, whose key is its prefix. Not measured (no TPU has been lent
    # to this project): 128 keys is the smallest key tile the kernel's layout allows (keys' data on lanes) and one
    # pass of a 128x128 MXU (v4, v5e, v5p); v6e's MXU is 256x256, so it takes 256x256. Each row compiles for its
    # generation, forward and backward, at head dim 128 (tests/test_pallas_tpu.py::TestTpuCompile).
    # num_warps / num_stages are Triton's and unused here.
    "TPU v6": BlockSizes(block_q=256, block_k=256),
    "TPU v5 lite": BlockSizes(block_q=128, block_k=128),
    "TPU v5": BlockSizes(block_q=128, block_k=128),
    "TPU v4": BlockSizes(block_q=128, block_k=128),
    # Any other TPU kind (a generation not listed above), and the TPU kernels' tiles on a host that is no TPU
    # (lowering for a TPU from a CPU, interpret mode): see ``tpu_block_sizes``.
    "TPU": BlockSizes(block_q=128, block_k=128),
    # Interpret mode runs one grid step at a time on the host: larger tiles mean fewer, vectorised steps.
    "cpu": BlockSizes(block_q=64, block_k=64),
    "default": BlockSizes(block_q=64, block_k=64, num_warps=4, num_stages=2),
}


# A TPU vreg is 8 sublanes x 128 lanes; the TPU kernels put keys on lanes (see ``tpu_attention``).
TPU_LANES = 128


def block_sizes_for(device_kind: str | None = None, table: dict[str, BlockSizes] | None = None) -> BlockSizes:
    """Tiles for ``device_kind`` (default: the first JAX device's kind) from ``table`` (default ``TILE_SIZES``)."""
    table = TILE_SIZES if table is None else table
    if device_kind is None:
        import jax  # local: keeps this module importable as plain data

        device_kind = jax.devices()[0].device_kind
    kind = device_kind.lower()
    for key, sizes in table.items():
        if key != "default" and key.lower() in kind:
            return sizes
    if "default" not in table:
        raise ValueError(f"no tile sizes for device kind {device_kind!r} and no 'default' entry in {sorted(table)}")
    return table["default"]


def tpu_block_sizes(device_kind: str | None = None, table: dict[str, BlockSizes] | None = None) -> BlockSizes:
    """Default tiles of the TPU (Mosaic) kernels, legal for Mosaic at every length and head dim.

    The row of ``device_kind`` (default: the first JAX device's kind) when it is a TPU, else the generic "TPU"
    row (lowering for a TPU from a CPU host, TPU interpret mode), with ``block_k`` raised to at least
    ``TPU_LANES``. Why that is always legal, with ``tpu_attention.tile_sizes`` shrinking a tile to the input:
    tiles are powers of two of at least 16 (``BlockSizes``), so ``block_q`` is a multiple of 8 sublanes (and of
    16, the bf16 packing) whether or not it shrinks; an unshrunk ``block_k`` is a power of two >= 128, so a
    multiple of 128 lanes, and a shrunk one is ``max(16, next_power_of_2(S)) >= S`` keys, so the keys pad to
    exactly one tile that covers them all. The head dim is never tiled.
    """
    table = TILE_SIZES if table is None else table
    if device_kind is None:
        import jax  # local: keeps this module importable as plain data

        device_kind = jax.devices()[0].device_kind
    sizes = block_sizes_for(device_kind, table) if "tpu" in device_kind.lower() else table.get("TPU", TILE_SIZES["TPU"])
    return dataclasses.replace(sizes, block_k=max(sizes.block_k, TPU_LANES))
