"""Autoregressive decoding, greedy or sampled (``decoding.sampling``): the baseline every speedup is measured
against, and the ground truth of the lossless check.

AR is a ``BlockDecoder`` with one token per forward: the prefill forwards the whole prompt and chooses the first
token, each step forwards every row's last token and chooses the next. So it runs on the same request loop as
Jacobi and multi-block decoding (``runner.decode_prompts``: batching, warm-up, timing, statistics) and has the
same two drivers (a ``lax.while_loop`` on device, or a Python loop that streams tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from jf_jax.decoding.blocks import prefill_rows
from jf_jax.decoding.common import (GenerationResult, StopReason, eos_array, is_eos, prepare_prompts)
from jf_jax.decoding.runner import BlockDecoder, OnTokens, decode_prompts, keep_if_done, per_row
from jf_jax.decoding.sampling import GREEDY, Sampling, choose
from jf_jax.decoding.shapes import DecodeShape, fixed_forward
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import DecodeView
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import Params
from jf_jax.model.token_meta import causal_meta
from jf_jax.model.transformer import forward, logits


@decode_jit(static_argnames=("cfg", "capacity", "width"))
def prefill(params: Params, cfg: ModelConfig, tokens, lengths, capacity: int, width: int | None = None):
    """Forwards right-padded prompts [B, P] into a fresh cache; returns (cache, next-token logits [B, V]).

    With a fixed decode shape's ``width`` W (``decoding.shapes``) the forward has P + W tokens (the last W are
    padding), attends over the whole cache and computes the logits of W positions from the prompt's last, exactly
    as the Jacobi prefill does at that width, and returns the first of them."""
    if width is not None:
        cache, row_logits = prefill_rows(params, cfg, jnp.pad(tokens, ((0, 0), (0, width))), lengths, lengths,
                                         capacity, width, whole_cache=True)
        return cache, row_logits[:, 0]
    B, P = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    meta = causal_meta(positions, valid=positions < lengths[:, None])
    hidden, cache = forward(params, cfg, tokens, meta=meta, cache=KVCache.init(cfg, B, capacity))
    last = hidden[jnp.arange(B), lengths - 1]  # [B, D]
    return cache.with_lengths(lengths), logits(params, cfg, last)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ARState:
    """Loop state of B prompts decoded together; every field has a leading [B] row axis (shapes below are one
    row's), except the cache, which holds B rows."""

    out: jax.Array  # [N] generated ids, -1 past count
    count: jax.Array  # [] tokens generated so far
    done: jax.Array  # [] stopped on EOS or max_new (or a padding row of the batch)
    last: jax.Array  # [] last generated token (the next step's input)
    cache: KVCache | None  # B rows (None in a one-row view)
    sample_key: jax.Array  # [2] sampling key (``decoding.sampling``), fixed for the prompt
    max_new: jax.Array  # []
    eos_ids: jax.Array  # [8] padded with -1
    forwards: jax.Array  # [] model forwards, prefill included
    stop: jax.Array  # [] a StopReason value


def _stop(eos, count, max_new):
    return jnp.where(eos, StopReason.EOS, jnp.where(count >= max_new, StopReason.MAX_NEW_TOKENS,
                                                     StopReason.RUNNING)).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class ARDecoder(BlockDecoder):
    """AR as a block decoder of one token per forward (``block_size`` is 1)."""

    @decode_jit(static_argnums=(0, 8, 9))
    def init(self, params: Params, prompts, prompt_lens, keys, sample_keys, max_new, eos_ids, out_capacity: int,
             capacity: int) -> ARState:
        """The prefill and the first token (chosen at position ``prompt_len``); ``keys`` (drafts) are unused."""
        del keys
        B = prompts.shape[0]
        cache, first_logits = prefill(params, self.cfg, prompts, prompt_lens, capacity, self.prefill_width)
        first = choose(self.sampling, first_logits, cache.lengths, sample_keys)
        eos_ids = jnp.broadcast_to(eos_ids, (B,) + eos_ids.shape)
        max_new = per_row(max_new, B)
        first_eos = jax.vmap(is_eos)(first, eos_ids)
        count = jnp.ones((B,), jnp.int32)
        stop = _stop(first_eos, count, max_new)
        return ARState(out=jnp.full((B, out_capacity), -1, jnp.int32).at[:, 0].set(first), count=count,
                       done=stop != StopReason.RUNNING, last=first, cache=cache, sample_key=sample_keys,
                       max_new=max_new, eos_ids=eos_ids, forwards=jnp.ones((B,), jnp.int32), stop=stop)

    def _step(self, params, s: ARState) -> ARState:
        if self.shape is None:
            hidden, cache = forward(params, self.cfg, s.last[:, None], cache=s.cache)
            nxt = choose(self.sampling, logits(params, self.cfg, hidden[:, 0]), s.cache.lengths + 1, s.sample_key)
        else:  # the token as row 0, column 0 of the run's fixed decode shape
            one = s.last[:, None, None]
            g, k, v = fixed_forward(params, self.cfg, self.shape, one, jnp.ones(one.shape, bool), s.cache,
                                    self.sampling, s.sample_key)
            nxt, cache = g[:, 0, 0], s.cache.write(k[:, :, 0], v[:, :, 0])
        active = ~s.done
        cache = cache.commit(active.astype(jnp.int32))  # a finished row keeps its length: its write is dead

        def row(s: ARState, nxt):
            count = s.count + 1
            stop = _stop(is_eos(nxt, s.eos_ids), count, s.max_new)
            new = dataclasses.replace(s, out=s.out.at[s.count].set(nxt, mode="drop"), count=count, last=nxt,
                                      done=stop != StopReason.RUNNING, forwards=s.forwards + 1, stop=stop)
            return keep_if_done(s, new)

        rows = jax.vmap(row)(dataclasses.replace(s, cache=None), nxt)
        return dataclasses.replace(rows, cache=cache)

    def row_stats(self, host_row) -> dict:
        return {}  # no blocks, drafts or acceptance: tokens, forwards and the stop reason say everything


def generate_ar(params: Params | DecodeView, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                eos_ids: Sequence[int], batch_size: int = 1, driver: str = "compiled", warmup: bool = True,
                sampling: Sampling = GREEDY, seed: int = 0, first_index: int = 0,
                on_tokens: OnTokens | None = None, mesh=None,
                decode_shape: DecodeShape | None = None) -> GenerationResult:
    """AR decoding of token-id prompts, ``batch_size`` at a time (``runner.decode_prompts``: a short last batch is
    padded with finished rows). Greedy by default; with a ``sampling`` temperature > 0, prompt i samples with
    ``sampling_key(seed, first_index + i)`` whatever its batch (``first_index``: where this call's prompts start in
    a request decoded in several calls). With ``warmup`` the programs are compiled first, so ``seconds`` excludes
    compilation; ``driver="python"`` streams accepted tokens to ``on_tokens(prompt_index, ids)``; ``mesh`` splits
    each batch's rows over devices (``runner.decode_prompts``); ``decode_shape`` pads every forward to that shape
    (``decoding.shapes``: the same shape as the Jacobi / multi-block runs it is compared with)."""
    if decode_shape is not None:
        decode_shape.check_covers("ar", 1, 1)
    prep = prepare_prompts(cfg, prompts, max_new_tokens, lookahead=1 if decode_shape is None else decode_shape.width)
    decoder = ARDecoder(cfg, 1, sampling=sampling, shape=decode_shape)
    result = decode_prompts(decoder, params, prep, eos_array(eos_ids), seed=seed, batch_size=batch_size,
                            driver=driver, warmup=warmup, on_tokens=on_tokens, first_index=first_index, mesh=mesh)
    result.stats.pop("block_size")
    result.stats["method"] = "ar"
    return result
