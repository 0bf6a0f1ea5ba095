"""Block arithmetic shared by Jacobi (``decoding.jacobi``) and multi-block decoding (``decoding.multiblock``).

All functions are pure and traced inside the decoders' steps: drafting from the context, verifying a draft
against the model's predictions, capping what is accepted at EOS and ``max_new_tokens``, emitting tokens, the
prefill-drafting trick, and the stop reason of a step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jf_jax.decoding.common import StopReason, is_eos
from jf_jax.decoding.sampling import Sampling, choose
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import Params
from jf_jax.model.token_meta import causal_meta
from jf_jax.model.transformer import forward, logits


def context_ids(prompt, prompt_len, out, idx):
    """Ids at indices ``idx`` of the context ``prompt[:prompt_len] ++ out`` (the prompt, then generated ids)."""
    from_prompt = prompt[jnp.clip(idx, 0, prompt.shape[0] - 1)]
    from_out = out[jnp.clip(idx - prompt_len, 0, out.shape[0] - 1)]
    return jnp.where(idx < prompt_len, from_prompt, from_out).astype(jnp.int32)


# A draft only has to be some guess from the context: whatever it holds, the fixed point is AR's output. So the
# draws are a counter-based integer hash of (key, block start, slot) rather than jax.random's threefry, whose rolled
# rounds add some 30 small kernels to every decode program (XLA:CPU compile time, and launches every step).
_GOLDEN = 0x9E3779B9


def _mix32(x):
    """A 32-bit integer finaliser (xorshift-multiply rounds): every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def draw_context(key, prompt, prompt_len, out, count, num: int):
    """``num`` ids drawn uniformly (with replacement) from the context ``prompt[:prompt_len] ++ out[:count]``
    (``key`` [2] uint32, from ``block_key``; the modulo's bias is below 2**-16 for contexts under 2**16 ids)."""
    key = key.astype(jnp.uint32)
    slots = jnp.arange(num, dtype=jnp.uint32) * jnp.uint32(_GOLDEN)
    bits = _mix32(key[0] ^ _mix32(key[1] + slots))
    size = jnp.asarray(prompt_len + count).astype(jnp.uint32)
    return context_ids(prompt, prompt_len, out, (bits % size).astype(jnp.int32))


def block_key(key, block_start):
    """The key a block's random draft is drawn with: the prompt's draft key (``common.prompt_key``) hashed with the
    block's first output position. It depends on nothing else (not on earlier blocks, iterations or the batch), so
    any block's draft can be redrawn on its own: the batched trajectory recorder iterates every block of a response
    independently and gets the very drafts the one-prompt decoder drew."""
    key, start = key.astype(jnp.uint32), jnp.asarray(block_start).astype(jnp.uint32)
    return jnp.stack([_mix32(key[0] ^ _mix32(start)), _mix32(key[1] ^ _mix32(start ^ jnp.uint32(_GOLDEN)))])


def leading_matches(draft, pred, valid_len):
    """ok[j] = draft[j] == pred[j-1] for 1 <= j < valid_len (ok[0] = True); returns ok [W] and the length of the
    leading run of ok among j >= 1 (so ``1 + run`` tokens of the draft are verified)."""
    W = draft.shape[-1]
    j = jnp.arange(W)
    ok = jnp.concatenate([jnp.ones(draft.shape[:-1] + (1,), bool), draft[..., 1:] == pred[..., :-1]], axis=-1)
    ok = ok & (j < valid_len)
    run = jnp.sum(jnp.cumprod(ok[..., 1:].astype(jnp.int32), axis=-1), axis=-1)
    return ok, run


def cap_accepted(draft, accepted, count, max_new, eos_ids):
    """Caps the accepted count at the first EOS in ``draft[:accepted]`` and at ``max_new - count``.

    Returns (accepted, hit_eos); ``hit_eos`` is True only when the EOS itself is accepted, not when the
    ``max_new_tokens`` cap cuts the prefix before it.
    """
    j = jnp.arange(draft.shape[0])
    eos_here = is_eos(draft, eos_ids) & (j < accepted)
    eos_end = jnp.argmax(eos_here) + 1  # tokens up to and including the first EOS
    room = max_new - count
    hit_eos = jnp.any(eos_here) & (eos_end <= room)
    accepted = jnp.where(jnp.any(eos_here), jnp.minimum(accepted, eos_end), accepted)
    return jnp.minimum(accepted, room).astype(jnp.int32), hit_eos


def emit(out, count, tokens, num):
    """Writes ``tokens[:num]`` into ``out`` at ``count`` (nothing else moves)."""
    j = jnp.arange(tokens.shape[0])
    idx = jnp.where(j < num, count + j, out.shape[0])
    return out.at[idx].set(tokens, mode="drop")


def prefill_rows(params: Params, cfg: ModelConfig, tokens, valid_lens, prompt_lens, capacity: int, width: int,
                 whole_cache: bool):
    """Forwards ``tokens`` [B, T] (row b valid below ``valid_lens[b]``) into a fresh cache and returns the cache
    holding only the prompts (``prompt_lens``) and the float32 logits [B, width, V] of the ``width`` positions from
    each prompt's last token on. The Jacobi prefill-drafting trick and AR's prefill at a fixed decode shape share
    it, so both compute a prompt's first-token logits with one program shape."""
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    meta = causal_meta(positions, valid=positions < valid_lens[:, None])
    hidden, cache = forward(params, cfg, tokens, meta=meta, cache=KVCache.init(cfg, B, capacity),
                            whole_cache=whole_cache)
    rows = jax.vmap(lambda h, length: jax.lax.dynamic_slice_in_dim(h, length - 1, width))(hidden, prompt_lens)
    return cache.with_lengths(prompt_lens), logits(params, cfg, rows)


def prefill_draft(params: Params, cfg: ModelConfig, prompts, prompt_lens, guesses, capacity: int,
                  sampling: Sampling, sample_keys, width: int | None = None):
    """The prefill-drafting trick, for B rows: forwards ``prompt[:prompt_len] ++ guesses`` (n guesses) of each row
    into a fresh cache.

    prompts [B, P], prompt_lens [B], guesses [B, n], sample_keys [B, 2]. Returns the cache holding only the prompts
    (the guesses' KV is dropped) and per row the n tokens chosen from ``logits[P-1 : P+n-1]`` (positions P ..
    P+n-1) [B, n]: the true first response token followed by a once-refined draft. With a fixed decode shape of
    ``width`` W >= n (``decoding.shapes``) the forward has P + W tokens, attends over the whole cache and computes
    the logits of W positions, as AR's prefill does at that width.
    """
    B, n = guesses.shape
    W = n if width is None else width
    T = prompts.shape[1] + W

    def row_tokens(prompt, prompt_len, row_guesses):
        tokens = jax.lax.dynamic_update_slice(jnp.pad(prompt, (0, W)), row_guesses, (prompt_len,))
        return jnp.where(jnp.arange(T) < prompt_len + n, tokens, 0)

    tokens = jax.vmap(row_tokens)(prompts, prompt_lens, guesses)
    cache, row_logits = prefill_rows(params, cfg, tokens, prompt_lens + n, prompt_lens, capacity, W,
                                     whole_cache=width is not None)
    chosen = choose(sampling, row_logits, prompt_lens[:, None] + jnp.arange(W), sample_keys)
    return cache, chosen[:, :n]


class BlockStart(NamedTuple):
    """What both block decoders begin with, after the prefill-drafting forward (every field per row, [B, ...])."""

    key: jax.Array  # [B, 2] the prompts' draft keys (block drafts are drawn with ``block_key``)
    sample_key: jax.Array  # [B, 2] the sampling keys (``decoding.sampling``; unused when greedy)
    guesses: jax.Array  # [B, n] the random draft the first block started from
    first: jax.Array  # [B, n] the first block's first draft (first[:, 0] is the first response token)
    first_eos: jax.Array  # [B] that token is EOS: generation ends with the one forward AR would also spend
    out: jax.Array  # [B, N] generated ids, -1 past the count (holds the EOS when first_eos)
    cache: KVCache  # B rows, holding the prompts
    block_iters: jax.Array  # [B, max_blocks] zeros: iterations per block
    accept_hist: jax.Array  # [B, n + 1] zeros: histogram of tokens accepted per iteration


@decode_jit(static_argnames=("cfg", "n", "sampling", "out_capacity", "capacity", "width"))
def start_blocks(params: Params, cfg: ModelConfig, n: int, sampling: Sampling, prompts, prompt_lens, keys,
                 sample_keys, eos_ids, out_capacity: int, capacity: int, width: int | None = None) -> BlockStart:
    """Draws n guesses per row from its prompt (with ``block_key(key, 0)``), runs ``prefill_draft`` (at a fixed
    decode shape's ``width``, if any) and emits an EOS first token.

    A program of its own, not part of each decoder's ``init``: Jacobi and multi-block decoding of the same
    prompts and block size begin with this same forward over the whole prompt, the largest program of a run's
    start, so a run of both methods compiles it once."""
    B = prompts.shape[0]
    out = jnp.full((B, out_capacity), -1, jnp.int32)
    guesses = jax.vmap(lambda k, p, pl, o: draw_context(block_key(k, 0), p, pl, o, 0, n))(keys, prompts, prompt_lens,
                                                                                         out)
    cache, first = prefill_draft(params, cfg, prompts, prompt_lens, guesses, capacity, sampling, sample_keys, width)
    first_eos = is_eos(first[:, 0], eos_ids)
    out = jnp.where(first_eos[:, None], jax.vmap(lambda o, f: emit(o, 0, f, 1))(out, first), out)
    return BlockStart(key=keys, sample_key=sample_keys, guesses=guesses, first=first, first_eos=first_eos, out=out,
                      cache=cache,
                      block_iters=jnp.zeros((B, out_capacity // n + 2), jnp.int32),
                      accept_hist=jnp.zeros((B, n + 1), jnp.int32))


def first_stop(first_eos):
    """Stop reason after the prefill: ``EOS_FIRST`` when the first generated token is EOS."""
    return jnp.where(first_eos, StopReason.EOS_FIRST, StopReason.RUNNING).astype(jnp.int32)


def step_stop(stopped, hit_eos, extra_eos, full, count, max_new):
    """The ``StopReason`` value of a step that ended generation (``RUNNING`` while it goes on, or when it had
    stopped before: ``stopped``).

    ``hit_eos``: an EOS was accepted from the draft; ``extra_eos``: the correction token (``full`` False) or the
    bonus token (``full`` True) was EOS; otherwise the count reaching ``max_new`` ends it.
    """
    extra = jnp.where(full, StopReason.EOS_BONUS, StopReason.EOS_CORRECTION)
    reason = jnp.where(extra_eos, extra, jnp.where(count >= max_new, StopReason.MAX_NEW_TOKENS, StopReason.RUNNING))
    return jnp.where(stopped, StopReason.RUNNING, jnp.where(hit_eos, StopReason.EOS_ACCEPTED, reason)).astype(jnp.int32)
