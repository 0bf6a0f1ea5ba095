"""Plain-JAX attention with the per-token mask rule: the semantics every kernel must reproduce."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pallas_kernels.mask import MASK_NOISE_CONDITIONED, TokenMeta, dense_mask

# Finite so that fully masked rows give a uniform softmax instead of NaN; those rows are zeroed afterwards.
_MASKED_SCORE = -1e30


def check_attention_shapes(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [B, T, H, D]; got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    B, T, H, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree in batch or head_dim")
    if H % k.shape[2]:
        raise ValueError(f"query heads ({H}) must be a multiple of kv heads ({k.shape[2]})")
    for name, meta, shape in (("q_meta", q_meta, (B, T)), ("k_meta", k_meta, (B, k.shape[1]))):
        for field, value in zip(TokenMeta._fields, meta):
            if tuple(value.shape) != shape:
                raise ValueError(f"{name}.{field} has shape {tuple(value.shape)}, expected {shape}")


def attention_reference(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *,
                        mask_kind: str = MASK_NOISE_CONDITIONED, scale: float | None = None, precision=None):
    """Masked multi-head attention with grouped KV heads.

    q: [B, T, H, D]; k, v: [B, S, K, D] with H a multiple of K; q_meta fields [B, T], k_meta fields [B, S].
    Returns [B, T, H, D] in q's dtype. Scores and softmax are float32. A query that may attend no key
    (padding, or an empty segment) gets an all-zero output row. ``precision``: of both dots (None: JAX's
    default, which is TF32 for float32 on an Ampere-or-later GPU).
    """
    check_attention_shapes(q, k, v, q_meta, k_meta)
    B, T, H, D = q.shape
    K = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qg = q.reshape(B, T, K, H // K, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, precision=precision,
                        preferred_element_type=jnp.float32) * scale
    mask = dense_mask(q_meta, k_meta, mask_kind)[:, None, None]  # [B, 1, 1, T, S]
    scores = jnp.where(mask, scores, _MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(mask.any(axis=-1, keepdims=True), probs, 0.0)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, precision=precision,
                     preferred_element_type=jnp.float32)
    return out.reshape(B, T, H, D).astype(q.dtype)
