"""Jacobi decoding (docs/method.md section 1, decisions 1, 9): one step function, two drivers. Greedy as described here;
with ``decoding.sampling`` every ``argmax`` below is the keyed Gumbel-max choice of the same position, and the
fixed point is AR's sampled sequence.

A block of n tokens is decoded by fixed-point iteration. The current draft (``draft_len`` <= n tokens, padded
to n; padded queries carry segment -1 and neither attend nor are attended) is forwarded over the committed
KV cache; ``g = argmax(float32 logits)``; ``g[i]`` is the model's greedy token for the position after draft
token i. The longest prefix of the draft that agrees with those predictions is *accepted* (its first token is
known-correct, so at least one token per forward); its KV, written by the same forward, is kept by moving the
cache length, the rest is rolled back. The next draft is ``[correction g[a-1]] ++ g[a : L-1]``; on full
acceptance ``g[L-1]`` (the bonus token) starts the next block, whose draft is ``[bonus] ++ (n-1) tokens drawn
from the context ids (prompt + generated)`` with ``blocks.block_key(prompt key, block start)``. The first block uses
the prefill-drafting trick: the prompt is forwarded with n drawn guesses appended; the guesses' KV is dropped and
``argmax(logits[P-1 : P+n-1])`` is the first draft. EOS caps the accepted prefix, and an EOS correction or
bonus token is emitted and ends generation; nothing is emitted past EOS or ``max_new_tokens``.

Drivers (``decoding.runner``): ``run_compiled`` (a ``lax.while_loop`` over iterations and blocks, no host round
trip) and ``run_python`` (the same jitted step from Python: streams tokens; ``decoding.recording`` records every
iterate of every block for training). The batched recorder (``decoding.batch_recording``) runs the same step in a
loop of its own that records every iterate on device.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jf_jax.decoding.blocks import (block_key, cap_accepted, draw_context, emit, first_stop, leading_matches,
                                    start_blocks, step_stop)
from jf_jax.decoding.common import GenerationResult, check_int, eos_array, is_eos, prepare_prompts
from jf_jax.decoding.sampling import GREEDY, Sampling, choose
from jf_jax.decoding.shapes import DecodeShape, fixed_forward
from jf_jax.decoding.runner import MAX_BLOCK_SIZE, BlockDecoder, OnTokens, decode_prompts, keep_if_done, per_row
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import DecodeView
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import Params
from jf_jax.model.token_meta import causal_meta
from jf_jax.model.transformer import forward, logits


# ----------------------------------------------------------------------------------------------------------
# Vanilla Jacobi: state, step and drivers.

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class JacobiState:
    """Loop state of B prompts decoded together; every field is an array with a leading [B] row axis (the
    shapes below are one row's), except the cache, which holds B rows."""

    draft: jax.Array  # [n] current draft of the block, valid up to draft_len; draft[0] is known-correct
    draft_len: jax.Array  # [] n - tokens accepted in this block
    block_init: jax.Array  # [n] the draft the current block started from (trajectory state 0)
    out: jax.Array  # [N] generated ids, -1 past count
    count: jax.Array  # [] tokens generated (== committed KV slots past the prompt)
    block_start: jax.Array  # [] count at the start of the current block
    done: jax.Array  # [] stopped on EOS or max_new (or a padding row of the batch)
    cache: KVCache | None  # B rows; lengths == prompt_len + count (None in a one-row view)
    prompt: jax.Array  # [P] bucketed prompt
    prompt_len: jax.Array  # []
    key: jax.Array  # [2] the prompt's draft key: block drafts are drawn with ``blocks.block_key(key, start)``
    sample_key: jax.Array  # [2] sampling key (``decoding.sampling``), fixed for the prompt
    max_new: jax.Array  # []
    eos_ids: jax.Array  # [8] padded with -1
    forwards: jax.Array  # [] model forwards, prefill included
    block: jax.Array  # [] index of the current block
    block_iters: jax.Array  # [max_blocks] iterations (forwards after prefill) per block
    accept_hist: jax.Array  # [n + 1] histogram of tokens accepted per iteration
    stop: jax.Array  # [] a StopReason value


@dataclasses.dataclass(frozen=True)
class JacobiDecoder(BlockDecoder):
    """The static half of Jacobi decoding: the model config and the block size (hashable; a jit static arg).
    Drivers (``run_compiled``, ``run_python``) come from ``BlockDecoder``."""

    def init(self, params: Params, prompts, prompt_lens, keys, sample_keys, max_new, eos_ids, out_capacity: int,
             capacity: int) -> JacobiState:
        """Prefill with the drafting trick; the returned state's draft is each row's first block's first draft."""
        b = start_blocks(params, self.cfg, self.block_size, self.sampling, prompts, prompt_lens, keys, sample_keys,
                         eos_ids, out_capacity, capacity, self.prefill_width)
        # the cache joins the state outside the state's program, which would otherwise copy it
        state = self._first_state(b._replace(cache=None), prompts, prompt_lens, max_new, eos_ids)
        return dataclasses.replace(state, cache=b.cache)

    @decode_jit(static_argnums=0)
    def _first_state(self, b, prompts, prompt_lens, max_new, eos_ids) -> JacobiState:
        n = self.block_size
        rows = functools.partial(per_row, batch=prompts.shape[0])
        return JacobiState(
            draft=b.first, draft_len=rows(n), block_init=b.guesses, out=b.out, count=b.first_eos.astype(jnp.int32),
            block_start=rows(0), done=b.first_eos, cache=b.cache, prompt=prompts, prompt_len=prompt_lens, key=b.key,
            sample_key=b.sample_key, max_new=rows(max_new), eos_ids=rows(eos_ids), forwards=rows(1), block=rows(0),
            block_iters=b.block_iters,
            accept_hist=b.accept_hist, stop=first_stop(b.first_eos))

    def _step(self, params: Params, s: JacobiState) -> JacobiState:
        n = self.block_size
        j = jnp.arange(n)
        if self.shape is None:
            positions = s.cache.lengths[:, None] + j
            meta = causal_meta(positions, valid=j < s.draft_len[:, None])
            hidden, cache = forward(params, self.cfg, s.draft, meta=meta, cache=s.cache)
            g = choose(self.sampling, logits(params, self.cfg, hidden), positions + 1, s.sample_key)  # [B, n]
        else:  # the draft as row 0 of the run's fixed decode shape
            g, k, v = fixed_forward(params, self.cfg, self.shape, s.draft[:, None],
                                    (j < s.draft_len[:, None])[:, None], s.cache, self.sampling, s.sample_key)
            g, cache = g[:, 0], s.cache.write(k[:, :, 0], v[:, :, 0])
        rows, accepted = jax.vmap(self._advance)(dataclasses.replace(s, cache=None), g)
        return dataclasses.replace(rows, cache=cache.commit(accepted))

    def _advance(self, s: JacobiState, g):
        """One row's bookkeeping after the forward: ``g`` [n] are the model's predictions for its draft. Returns
        the row's new state (unchanged once done) and how many of its written KV slots to commit."""
        n = self.block_size
        j = jnp.arange(n)
        _, run = leading_matches(s.draft, g, s.draft_len)
        accepted, hit_eos = cap_accepted(s.draft, 1 + run, s.count, s.max_new, s.eos_ids)
        out = emit(s.out, s.count, s.draft, accepted)
        count = s.count + accepted
        done = hit_eos | (count >= s.max_new)

        # Next draft: correction token + shifted predictions (g[a-1 + i]); on full acceptance g[L-1] is the bonus.
        shifted = jnp.take(g, jnp.clip(accepted - 1 + j, 0, n - 1))
        full = accepted == s.draft_len
        extra = shifted[0]  # correction (partial acceptance) or bonus (full acceptance)
        extra_eos = ~done & is_eos(extra, s.eos_ids)
        out = jnp.where(extra_eos, emit(out, count, shifted, 1), out)
        count = count + extra_eos
        stop = s.stop + step_stop(s.done, hit_eos, extra_eos, full, count, s.max_new)
        done = done | extra_eos

        fresh = jnp.concatenate([extra[None], draw_context(block_key(s.key, count), s.prompt, s.prompt_len, out,
                                                           count, n - 1)])
        new_block = full & ~done
        block_iters = s.block_iters.at[s.block].add(1, mode="drop")
        new = dataclasses.replace(
            s, draft=jnp.where(new_block, fresh, shifted), draft_len=jnp.where(new_block, n, s.draft_len - accepted),
            block_init=jnp.where(new_block, fresh, s.block_init), out=out, count=count,
            block_start=jnp.where(new_block, count, s.block_start), done=done,
            forwards=s.forwards + 1, block=s.block + new_block,
            block_iters=block_iters, accept_hist=s.accept_hist.at[accepted].add(1), stop=stop)
        return keep_if_done(s, new), jnp.where(s.done, 0, accepted)


# ----------------------------------------------------------------------------------------------------------
# Public entry points: decoding and trajectory recording.

def generate_jacobi(params: Params | DecodeView, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *,
                    max_new_tokens: int, eos_ids: Sequence[int], block_size: int = 64, seed: int = 0,
                    batch_size: int = 1, warmup: bool = True, driver: str = "compiled",
                    on_tokens: OnTokens | None = None,
                    on_step: Callable[[int, JacobiState, JacobiState], None] | None = None,
                    sampling: Sampling = GREEDY, first_index: int = 0,
                    decode_shape: DecodeShape | None = None, mesh=None) -> GenerationResult:
    """Jacobi decoding of token-id prompts (greedy, or sampled with ``sampling``: the same tokens as AR with the
    same ``sampling`` and ``seed``; ``first_index`` as in ``runner.decode_prompts``), ``batch_size`` prompts at a
    time (each row with its own block, acceptance, cache length and stop; shapes are bucketed so new prompts reuse
    the compiled programs).
    ``driver="python"`` steps from the host and may stream, ``on_tokens(prompt_index, new_ids)``, and observe,
    ``on_step(prompt_index, before, after)`` (one-row views of the state). ``forwards`` counts the prefill;
    ``stats`` holds per-prompt and total statistics (``decoding.stats``); ``decode_shape`` pads every forward to
    that shape (``decoding.shapes``); ``mesh`` splits rows and weights over devices (``decoding.placement``)."""
    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    if decode_shape is not None:
        decode_shape.check_covers("jacobi", 1, n)
    prep = prepare_prompts(cfg, prompts, max_new_tokens, lookahead=n if decode_shape is None else decode_shape.width)
    return decode_prompts(JacobiDecoder(cfg, n, sampling=sampling, shape=decode_shape), params, prep,
                          eos_array(eos_ids),
                          seed=seed, batch_size=batch_size, driver=driver, warmup=warmup, on_tokens=on_tokens,
                          on_step=on_step, settings=dict(method="jacobi"), first_index=first_index, mesh=mesh)
