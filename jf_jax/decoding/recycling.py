"""Rejection recycling (docs/method.md, section 6, decision 7): an n-gram pool, candidate rows, a shared-prefix forward.

The pool is a ring of ``pool_size`` token entries harvested from iterations whose real-active (RA) draft was
partly rejected: (i) the last n committed tokens followed by the rejected part of the in-flight row, and
(ii) the model's greedy tail after the correction token. Before a forward, every entry that contains the
known-correct next token ``row[0]`` yields a candidate: the entry from that token's first occurrence, over the
RA draft's length (the row's own tokens fill what the entry lacks; the pseudo-active blocks after the RA are
the row's own). Up to ``pool_size - 1`` candidates, newest entry first, are verified as extra batch rows of one
forward that *shares* the committed KV: a prompt's cache row is read by its candidate rows inside each
layer, never copied per row, and only the winning row's new keys/values are written back. The winner is the
row with the most accepted tokens (the first row on ties, so the plain draft wins unless a candidate is better).
The pool lives for the whole generation (REF rebuilds it per block).
"""

from __future__ import annotations

import jax.numpy as jnp

from jf_jax.decoding.blocks import leading_matches
from jf_jax.decoding.sampling import Sampling, choose
from jf_jax.model.config import ModelConfig
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.transformer import forward_shared_prefix, logits
from jf_jax.model.params import Params


def forward_rows(params: Params, cfg: ModelConfig, tokens, valid, cache: KVCache, sampling: Sampling, sample_keys):
    """Forwards ``tokens`` [B*R, W] (``valid`` [B*R, W] marks real tokens) over the committed prefixes of a cache of
    B rows, each shared by its R consecutive token rows (``model.forward_shared_prefix``); the cache is not written.

    Returns (predictions [B*R, W]: the token chosen after each, with the token rows' ``sample_keys`` [B*R, 2];
    new keys [L, B*R, W, K, Dh], new values; the cache to write the kept row into, ``forward_shared_prefix``).
    """
    hidden, new_k, new_v, cache = forward_shared_prefix(params, cfg, tokens, cache, valid=valid)
    R = tokens.shape[0] // cache.lengths.shape[0]
    positions = jnp.repeat(cache.lengths, R)[:, None] + jnp.arange(tokens.shape[1])  # of the row's tokens
    return choose(sampling, logits(params, cfg, hidden), positions + 1, sample_keys), new_k, new_v, cache


def pick_winner(rows, preds, row_len, ra_len):
    """Index of the row [R, W] whose RA draft has the most verified tokens given its predictions ``preds``
    [R, W] (capped at ``ra_len``); the first row, the plain draft, on ties."""
    _, run = leading_matches(rows, preds, row_len)
    return jnp.argmax(jnp.minimum(1 + run, ra_len)).astype(jnp.int32)


def build_candidates(pool, pool_len, pool_next, row, ra_len, num: int):
    """Up to ``num`` candidate rows [num, W] for the RA draft ``row[:ra_len]``, and which of them exist [num].

    An entry yields a candidate iff it contains ``row[0]``; candidates identical to ``row`` are dropped.
    """
    S, Lp = pool.shape
    W = row.shape[0]
    order = (pool_next - 1 - jnp.arange(S)) % S  # newest entry first
    entries, lens = pool[order], pool_len[order]
    hit = (entries == row[0]) & (jnp.arange(Lp) < lens[:, None])
    start = jnp.argmax(hit, axis=-1)
    i = jnp.arange(W)
    src = start[:, None] + i
    from_entry = (i < ra_len) & (src < lens[:, None])
    cands = jnp.where(from_entry, jnp.take_along_axis(entries, jnp.clip(src, 0, Lp - 1), axis=1), row[None])
    useful = hit.any(-1) & jnp.any(cands != row[None], axis=-1)
    rank = jnp.cumsum(useful) - 1
    picks = [useful & (rank == k) for k in range(num)]
    found = jnp.stack([p.any() for p in picks])
    rows = jnp.stack([jnp.where(p.any(), cands[jnp.argmax(p)], row) for p in picks])
    return rows, found


def push(pool, pool_len, pool_next, entry, length, enabled):
    """Adds ``entry[:length]`` as the newest pool entry (overwriting the oldest) when ``enabled``."""
    enabled = enabled & (length >= 2)
    pool = jnp.where(enabled, pool.at[pool_next].set(entry), pool)
    pool_len = jnp.where(enabled, pool_len.at[pool_next].set(length), pool_len)
    return pool, pool_len, jnp.where(enabled, (pool_next + 1) % pool.shape[0], pool_next)


def harvest(context_fn, ctx_len, d, g, accepted, row_len, n: int, Lp: int):
    """The two entries of a partly rejected iteration: (recent committed tokens ++ rejected row, greedy tail).

    ``context_fn(idx)`` gives context ids (prompt + generated) at indices ``idx``; ``d``/``g`` are the verified
    row and its predictions [W]; returns ((entry, length), (entry, length)) with entries [Lp].
    """
    W = d.shape[0]
    i = jnp.arange(Lp)
    m = jnp.minimum(n, ctx_len)
    recent = context_fn(jnp.clip(ctx_len - m + i, 0, None))
    rejected = jnp.take(d, jnp.clip(accepted + i - m, 0, W - 1))
    first = jnp.where(i < m, recent, rejected)
    first_len = m + row_len - accepted
    tail = jnp.take(g, jnp.clip(accepted + i, 0, W - 1))
    tail_len = jnp.maximum(row_len - 1 - accepted, 0)
    return (first, first_len), (tail, tail_len)
