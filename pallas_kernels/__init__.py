"""Attention for jf-jax: the per-token mask rule, a plain-JAX reference and a Pallas flash kernel.

This package imports nothing from ``jf_jax``: the model reaches it only through its attention dispatch.
The kernel lives in ``pallas_kernels.flash_attention`` (imported on demand: it pulls in Pallas).
"""

from pallas_kernels.attention_reference import attention_reference, check_attention_shapes
from pallas_kernels.mask import (MASK_CLEAN_CONTEXT, MASK_KINDS, MASK_NOISE_CONDITIONED, STREAM_CLEAN,
                                 STREAM_CONTEXT, STREAM_NOISY, TokenMeta, allowed, dense_mask)
from pallas_kernels.tuning import TILE_SIZES, BlockSizes, block_sizes_for, tpu_block_sizes

__all__ = [
    "attention_reference", "check_attention_shapes", "TokenMeta", "allowed", "dense_mask",
    "STREAM_CONTEXT", "STREAM_NOISY", "STREAM_CLEAN", "MASK_NOISE_CONDITIONED", "MASK_CLEAN_CONTEXT", "MASK_KINDS",
    "BlockSizes", "TILE_SIZES", "block_sizes_for", "tpu_block_sizes",
]
