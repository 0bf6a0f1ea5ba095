"""Autoregressive decoding, greedy or sampled (``decoding.sampling``): the baseline every speedup is measured
against, and the ground truth of the lossless check.

Two compiled programs: ``prefill`` (the whole prompt in one forward, first token out) and ``ar_loop`` (a
``lax.while_loop`` of one-token steps that stops on EOS or max_new_tokens, with no host round trip per
token). A batch of prompts of different lengths decodes together; each row stops on its own.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp

from jf_jax.decoding.common import (GenerationResult, PreparedPrompts, StopReason, batch_slices, eos_array, is_eos,
                                    prepare_prompts, trim_outputs)
from jf_jax.decoding.sampling import GREEDY, Sampling, choose, sampling_key
from jf_jax.decoding.stats import prompt_stats, summarize
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import decode_view
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import Params
from jf_jax.model.token_meta import causal_meta
from jf_jax.model.transformer import forward, logits


@decode_jit(static_argnames=("cfg", "capacity"))
def prefill(params: Params, cfg: ModelConfig, tokens, lengths, capacity: int):
    """Forwards right-padded prompts [B, P] into a fresh cache; returns (cache, next-token logits [B, V])."""
    B, P = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    meta = causal_meta(positions, valid=positions < lengths[:, None])
    hidden, cache = forward(params, cfg, tokens, meta=meta, cache=KVCache.init(cfg, B, capacity))
    last = hidden[jnp.arange(B), lengths - 1]  # [B, D]
    return cache.with_lengths(lengths), logits(params, cfg, last)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ARState:
    """Loop state of ``ar_loop``; every field is an array."""

    out: jax.Array  # [B, N] generated ids, -1 past each row's count
    count: jax.Array  # [B] tokens generated so far
    done: jax.Array  # [B] stopped on EOS or max_new_tokens
    last: jax.Array  # [B] last generated token (the next step's input)
    cache: KVCache
    steps: jax.Array  # [] forwards run by the loop


@decode_jit(static_argnames=("cfg", "out_capacity", "sampling"), donate_argnames=("cache",))
def ar_loop(params: Params, cfg: ModelConfig, cache: KVCache, first_logits, max_new_tokens, eos_ids,
            out_capacity: int, sample_keys, sampling: Sampling = GREEDY) -> ARState:
    """One-token steps until every row hit EOS or ``max_new_tokens`` (a traced scalar). Each token is chosen by
    ``sampling.choose`` at its absolute position (``cache.lengths`` + 1 for the token after the step's input)
    with the row's sampling key ``sample_keys`` [B, 2] (unused when greedy)."""
    B = first_logits.shape[0]
    rows = jnp.arange(B)
    first = choose(sampling, first_logits, cache.lengths, sample_keys)  # the prefilled cache holds the prompt
    out = jnp.full((B, out_capacity), -1, jnp.int32).at[:, 0].set(first)
    count = jnp.ones((B,), jnp.int32)
    done = is_eos(first, eos_ids) | (count >= max_new_tokens)
    state = ARState(out=out, count=count, done=done, last=first, cache=cache, steps=jnp.zeros((), jnp.int32))

    def step(s: ARState) -> ARState:
        hidden, cache = forward(params, cfg, s.last[:, None], cache=s.cache)
        nxt = choose(sampling, logits(params, cfg, hidden[:, 0]), s.cache.lengths + 1, sample_keys)
        active = ~s.done
        cache = cache.commit(active.astype(jnp.int32))  # a finished row keeps its length: its write is dead
        out = s.out.at[rows, s.count].set(jnp.where(active, nxt, -1), mode="drop")
        count = s.count + active
        done = s.done | (active & (is_eos(nxt, eos_ids) | (count >= max_new_tokens)))
        return ARState(out=out, count=count, done=done, last=jnp.where(active, nxt, s.last), cache=cache,
                       steps=s.steps + 1)

    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)


def _run(params, cfg, tokens, lengths, prep: PreparedPrompts, eos, max_new_tokens: int, sample_keys,
         sampling: Sampling):
    start = time.perf_counter()
    cache, first_logits = prefill(params, cfg, tokens, lengths, prep.cache_capacity)
    first_logits.block_until_ready()
    prefill_done = time.perf_counter()
    state = ar_loop(params, cfg, cache, first_logits, jnp.int32(max_new_tokens), eos, prep.out_capacity,
                    sample_keys, sampling=sampling)
    out, count = jax.device_get((state.out, state.count))
    end = time.perf_counter()
    return out, count, end - start, prefill_done - start


def generate_ar(params: Params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                eos_ids: Sequence[int], batch_size: int | None = None, warmup: bool = True,
                sampling: Sampling = GREEDY, seed: int = 0, first_index: int = 0) -> GenerationResult:
    """AR decoding of token-id prompts, ``batch_size`` at a time (default: all in one batch; a short last batch
    is padded with copies of its last prompt). Greedy by default; with a ``sampling`` temperature > 0, prompt i
    samples with ``sampling_key(seed, first_index + i)`` whatever its batch (``first_index``: where this call's
    prompts start in a request decoded in several calls). With ``warmup`` the programs are compiled (by a
    1-token run on the same bucketed shapes) before the timed run, so ``seconds`` excludes compilation."""
    prep = prepare_prompts(cfg, prompts, max_new_tokens, lookahead=1)
    params = decode_view(params)  # the decoders' view, as jacobi and mr take it (no-op when already a view)
    eos = eos_array(eos_ids)
    num = len(prep.lengths)
    B, batches = batch_slices(num, batch_size)
    keys = jnp.stack([sampling_key(seed, first_index + i) for i in range(num)])
    if warmup:
        idx = batches[0][1]
        _run(params, cfg, prep.tokens[idx], prep.lengths[idx], prep, eos, 1, keys[idx], sampling)
    tokens, timings = [], []
    for first, idx in batches:
        out, count, seconds, prefill_seconds = _run(params, cfg, prep.tokens[idx], prep.lengths[idx], prep, eos,
                                                    prep.max_new_tokens, keys[idx], sampling)
        tokens += trim_outputs(out, count)[: num - first]
        timings.append(dict(seconds=seconds, prefill_seconds=prefill_seconds))
    seconds, prefill_seconds = (sum(t[k] for t in timings) for k in ("seconds", "prefill_seconds"))
    eos_set = set(int(e) for e in eos_ids)
    # Prompts decoded together share one wall clock: a prompt's own seconds exist only when it was alone.
    per_prompt = [prompt_stats(tokens=len(t), forwards=len(t), stop=StopReason.EOS if t[-1] in eos_set
                               else StopReason.MAX_NEW_TOKENS, **(timings[i] if B == 1 else {}))
                  for i, t in enumerate(tokens)]
    stats = dict(method="ar", batch_size=B, **sampling.describe(), seed=seed, per_prompt=per_prompt,
                 total=summarize(per_prompt, seconds=seconds, prefill_seconds=prefill_seconds))
    return GenerationResult(token_ids=tokens, forwards=[p["forwards"] for p in per_prompt], seconds=seconds,
                            prefill_seconds=prefill_seconds, stats=stats)
