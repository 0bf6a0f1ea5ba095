"""The attention mask as a rule over per-token data, shared by the reference and the kernels.

Every token (query or key) carries four int32 numbers:

* ``position``: its RoPE position. Causality within a stream is ``key.position <= query.position``.
* ``segment``: packed-sequence id; tokens attend only inside their own segment. ``segment < 0`` marks a
  padding token: it is never attended, and as a query it attends nothing (its output row is zero).
* ``stream``: ``STREAM_CONTEXT`` (prompt, or any ordinary causal token: all of decoding lives here),
  ``STREAM_NOISY`` or ``STREAM_CLEAN`` (the two copies of each block in a Jacobi Forcing packed sequence).
* ``block``: block index inside the response (``-1`` for context tokens).

The rule (docs/method.md, section 4, "noise-conditioned"): a key is visible to a query of the same
segment iff it is a context token at or before the query's position, or it is in the query's own stream and
either in an earlier block or in the same block at or before the query's position. Noisy blocks thus see the
prompt and earlier *noisy* blocks, clean blocks form a plain causal chain, and neither sees the other.
``MASK_CLEAN_CONTEXT`` (the CLLM-style ablation, docs/method.md) lets noisy blocks see the earlier *clean* blocks
instead of the earlier noisy ones.
When every token is a context token the rule is plain causal attention.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

STREAM_CONTEXT = 0
STREAM_NOISY = 1
STREAM_CLEAN = 2

MASK_NOISE_CONDITIONED = "noise_conditioned"
MASK_CLEAN_CONTEXT = "clean_context"
MASK_KINDS = (MASK_NOISE_CONDITIONED, MASK_CLEAN_CONTEXT)


class TokenMeta(NamedTuple):
    """Per-token mask data; every field is an int32 array of the same shape ([B, T] for a batch)."""

    position: jnp.ndarray
    segment: jnp.ndarray
    stream: jnp.ndarray
    block: jnp.ndarray


def allowed(q: TokenMeta, k: TokenMeta, kind: str = MASK_NOISE_CONDITIONED):
    """Elementwise visibility of key ``k`` to query ``q``; the fields broadcast against each other.

    Callers broadcast, e.g. ``q`` fields shaped [B, T, 1] and ``k`` fields [B, 1, S] give a [B, T, S] mask.
    """
    if kind not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {kind!r}; expected one of {MASK_KINDS}")
    same_segment = (q.segment >= 0) & (k.segment == q.segment)
    causal = k.position <= q.position
    context_key = (k.stream == STREAM_CONTEXT) & causal
    own_block = (k.stream == q.stream) & (k.block == q.block) & causal
    # The stream whose earlier blocks a query sees: its own, except that under the clean-context mask a
    # noisy block sees the earlier *clean* blocks instead of the earlier noisy ones.
    context_stream = q.stream
    if kind == MASK_CLEAN_CONTEXT:
        context_stream = jnp.where(q.stream == STREAM_NOISY, STREAM_CLEAN, q.stream)
    earlier_blocks = (k.stream == context_stream) & (k.block < q.block)
    return same_segment & (context_key | own_block | earlier_blocks)


def dense_mask(q: TokenMeta, k: TokenMeta, kind: str = MASK_NOISE_CONDITIONED):
    """[B, T, S] boolean mask from [B, T] query data and [B, S] key data (for the reference and for tests)."""
    q3 = TokenMeta(*(f[:, :, None] for f in q))
    k3 = TokenMeta(*(f[:, None, :] for f in k))
    return allowed(q3, k3, kind)
