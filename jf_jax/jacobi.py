"""Greedy Jacobi decoding (spec section 1 and Decisions 1, 9): one step function, two drivers.

A block of n tokens is decoded by fixed-point iteration. The current draft (``draft_len`` <= n tokens, padded
to n; padded queries carry segment -1 and neither attend nor are attended) is forwarded over the committed
KV cache; ``g = argmax(float32 logits)``; ``g[i]`` is the model's greedy token for the position after draft
token i. The longest prefix of the draft that agrees with those predictions is *accepted* (its first token is
known-correct, so at least one token per forward); its KV, written by the same forward, is kept by moving the
cache length, the rest is rolled back. The next draft is ``[correction g[a-1]] ++ g[a : L-1]``; on full
acceptance ``g[L-1]`` (the bonus token) starts the next block, whose draft is ``[bonus] ++ (n-1) tokens drawn
with a seeded JAX RNG from the context ids (prompt + generated)``. The first block uses the prefill-drafting
trick: the prompt is forwarded with n drawn guesses appended; the guesses' KV is dropped and
``argmax(logits[P-1 : P+n-1])`` is the first draft. EOS caps the accepted prefix, and an EOS correction or
bonus token is emitted and ends generation; nothing is emitted past EOS or ``max_new_tokens``.

Drivers: ``run_compiled`` (a ``lax.while_loop`` over iterations and blocks, no host round trip) and
``run_python`` (the same jitted step from Python: streams tokens, and ``record_trajectories`` records every
iterate of every block for training).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.ar_decode import greedy, is_eos
from jf_jax.config import ModelConfig
from jf_jax.generation import GenerationError, GenerationResult, eos_array, prepare_prompts
from jf_jax.kv_cache import KVCache
from jf_jax.masks import causal_meta
from jf_jax.model import forward, logits
from jf_jax.params import Params, unstack_layers

MAX_BLOCK_SIZE = 1024
DRIVERS = ("compiled", "python")
STOP_REASONS = ("running", "eos_accepted", "eos_correction", "eos_bonus", "eos_first", "max_new_tokens")


# ----------------------------------------------------------------------------------------------------------
# Pieces shared with multi-block decoding (jf_jax/multiblock.py).

def check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise GenerationError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def draw_context(key, prompt, prompt_len, out, count, num: int):
    """``num`` ids drawn uniformly (with replacement) from the context ``prompt[:prompt_len] ++ out[:count]``."""
    idx = jax.random.randint(key, (num,), 0, prompt_len + count)
    from_prompt = prompt[jnp.clip(idx, 0, prompt.shape[0] - 1)]
    from_out = out[jnp.clip(idx - prompt_len, 0, out.shape[0] - 1)]
    return jnp.where(idx < prompt_len, from_prompt, from_out).astype(jnp.int32)


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

    Returns (accepted, hit_eos)."""
    j = jnp.arange(draft.shape[0])
    eos_here = is_eos(draft, eos_ids) & (j < accepted)
    hit_eos = jnp.any(eos_here)
    accepted = jnp.where(hit_eos, jnp.argmax(eos_here) + 1, accepted)
    return jnp.minimum(accepted, max_new - count).astype(jnp.int32), hit_eos


def emit(out, count, tokens, num):
    """Writes ``tokens[:num]`` into ``out`` at ``count`` (nothing else moves)."""
    j = jnp.arange(tokens.shape[0])
    idx = jnp.where(j < num, count + j, out.shape[0])
    return out.at[idx].set(tokens, mode="drop")


def prefill_draft(params: Params, cfg: ModelConfig, prompt, prompt_len, guesses, capacity: int):
    """The prefill-drafting trick: forwards ``prompt[:prompt_len] ++ guesses`` (n guesses) into a fresh cache.

    Returns the cache holding only the prompt (the guesses' KV is dropped) and the n tokens
    ``argmax(logits[P-1 : P+n-1])``: the true first response token followed by a once-refined draft.
    """
    n = guesses.shape[0]
    T = prompt.shape[0] + n
    tokens = jax.lax.dynamic_update_slice(jnp.pad(prompt, (0, n)), guesses, (prompt_len,))
    tokens = jnp.where(jnp.arange(T) < prompt_len + n, tokens, 0)
    positions = jnp.arange(T, dtype=jnp.int32)[None]
    meta = causal_meta(positions, valid=positions < prompt_len + n)
    hidden, cache = forward(params, cfg, tokens[None], meta=meta, cache=KVCache.init(cfg, 1, capacity))
    rows = jax.lax.dynamic_slice_in_dim(hidden[0], prompt_len - 1, n)
    return cache.with_lengths(prompt_len), greedy(logits(params, cfg, rows))


def stop_reason(stopped, hit_eos, extra_eos, full, count, max_new):
    """Index into STOP_REASONS of why a step ended generation (0 while running)."""
    reason = jnp.where(extra_eos, jnp.where(full, 3, 2), jnp.where(count >= max_new, 5, 0))
    return jnp.where(stopped, 0, jnp.where(hit_eos, 1, reason)).astype(jnp.int32)


def base_stats(forwards, count, block_iters, accept_hist, stop) -> dict:
    """Host-side statistics of one prompt (arrays already on the host)."""
    iters = [int(i) for i in block_iters if i > 0]
    hist = [int(h) for h in accept_hist]
    return dict(forwards=int(forwards), tokens=int(count), stop_reason=STOP_REASONS[int(stop)],
                tokens_per_forward=float(count) / max(int(forwards), 1), blocks=len(iters),
                iterations_per_block=iters, mean_iterations_per_block=float(np.mean(iters)) if iters else 0.0,
                accepted_per_iteration_histogram=hist, max_accepted_per_iteration=max(
                    [k for k, h in enumerate(hist) if h > 0], default=0))


def total_stats(per_prompt: list[dict], sum_keys: Sequence[str]) -> dict:
    """Totals over prompts: sums of ``sum_keys``, tokens per forward of the sums, pooled iteration counts."""
    total = {k: int(sum(p[k] for p in per_prompt)) for k in sum_keys}
    iters = [i for p in per_prompt for i in p["iterations_per_block"]]
    hist = np.sum([p["accepted_per_iteration_histogram"] for p in per_prompt], axis=0)
    total.update(tokens_per_forward=total["tokens"] / max(total["forwards"], 1), blocks=len(iters),
                 mean_iterations_per_block=float(np.mean(iters)) if iters else 0.0,
                 accepted_per_iteration_histogram=[int(h) for h in hist])
    return total


# ----------------------------------------------------------------------------------------------------------
# Vanilla Jacobi: state, step and drivers.

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class JacobiState:
    """Loop state of one prompt (batch 1); every field is an array."""

    draft: jax.Array  # [n] current draft of the block, valid up to draft_len; draft[0] is known-correct
    draft_len: jax.Array  # [] n - tokens accepted in this block
    block_init: jax.Array  # [n] the draft the current block started from (trajectory state 0)
    out: jax.Array  # [N] generated ids, -1 past count
    count: jax.Array  # [] tokens generated (== committed KV slots past the prompt)
    block_start: jax.Array  # [] count at the start of the current block
    done: jax.Array  # [] stopped on EOS or max_new
    cache: KVCache  # batch 1; lengths == prompt_len + count
    prompt: jax.Array  # [P] bucketed prompt
    prompt_len: jax.Array  # []
    key: jax.Array  # PRNG key for the random drafts
    max_new: jax.Array  # []
    eos_ids: jax.Array  # [8] padded with -1
    forwards: jax.Array  # [] model forwards, prefill included
    block: jax.Array  # [] index of the current block
    block_iters: jax.Array  # [max_blocks] iterations (forwards after prefill) per block
    accept_hist: jax.Array  # [n + 1] histogram of tokens accepted per iteration
    stop: jax.Array  # [] index into STOP_REASONS


@dataclasses.dataclass(frozen=True)
class JacobiDecoder:
    """The static half of Jacobi decoding: the model config and the block size (hashable; a jit static arg)."""

    cfg: ModelConfig
    block_size: int

    @functools.partial(jax.jit, static_argnums=(0, 7, 8))
    def init(self, params: Params, prompt, prompt_len, key, max_new, eos_ids, out_capacity: int,
             capacity: int) -> JacobiState:
        """Prefill with the drafting trick; the returned state's draft is the first block's first draft."""
        n = self.block_size
        key, sub = jax.random.split(key)
        out = jnp.full((out_capacity,), -1, jnp.int32)
        guesses = draw_context(sub, prompt, prompt_len, out, 0, n)
        cache, first = prefill_draft(params, self.cfg, prompt, prompt_len, guesses, capacity)
        # An EOS first token ends generation here, with the one forward AR would also spend.
        first_eos = is_eos(first[0], eos_ids)
        out = jnp.where(first_eos, emit(out, 0, first, 1), out)
        return JacobiState(
            draft=first, draft_len=jnp.int32(n), block_init=guesses, out=out, count=first_eos.astype(jnp.int32),
            block_start=jnp.int32(0), done=first_eos, cache=cache, prompt=prompt, prompt_len=prompt_len, key=key,
            max_new=max_new, eos_ids=eos_ids, forwards=jnp.int32(1), block=jnp.int32(0),
            block_iters=jnp.zeros((out_capacity // n + 2,), jnp.int32), accept_hist=jnp.zeros((n + 1,), jnp.int32),
            stop=jnp.where(first_eos, 4, 0).astype(jnp.int32))

    def _step(self, params: Params, s: JacobiState) -> JacobiState:
        n = self.block_size
        j = jnp.arange(n)
        positions = (s.cache.lengths[0] + j)[None]
        meta = causal_meta(positions, valid=(j < s.draft_len)[None])
        hidden, cache = forward(params, self.cfg, s.draft[None], meta=meta, cache=s.cache)
        g = greedy(logits(params, self.cfg, hidden[0]))  # [n]

        _, run = leading_matches(s.draft, g, s.draft_len)
        accepted, hit_eos = cap_accepted(s.draft, 1 + run, s.count, s.max_new, s.eos_ids)
        out = emit(s.out, s.count, s.draft, accepted)
        count = s.count + accepted
        cache = cache.commit(accepted)
        done = hit_eos | (count >= s.max_new)

        # Next draft: correction token + shifted predictions (g[a-1 + i]); on full acceptance g[L-1] is the bonus.
        shifted = jnp.take(g, jnp.clip(accepted - 1 + j, 0, n - 1))
        full = accepted == s.draft_len
        extra = shifted[0]  # correction (partial acceptance) or bonus (full acceptance)
        extra_eos = ~done & is_eos(extra, s.eos_ids)
        out = jnp.where(extra_eos, emit(out, count, shifted, 1), out)
        count = count + extra_eos
        stop = s.stop + stop_reason(s.done, hit_eos, extra_eos, full, count, s.max_new)
        done = done | extra_eos

        key, sub = jax.random.split(s.key)
        fresh = jnp.concatenate([extra[None], draw_context(sub, s.prompt, s.prompt_len, out, count, n - 1)])
        new_block = full & ~done
        block_iters = s.block_iters.at[s.block].add(1, mode="drop")
        return dataclasses.replace(
            s, draft=jnp.where(new_block, fresh, shifted), draft_len=jnp.where(new_block, n, s.draft_len - accepted),
            block_init=jnp.where(new_block, fresh, s.block_init), out=out, count=count,
            block_start=jnp.where(new_block, count, s.block_start), done=done, cache=cache,
            key=jnp.where(new_block, key, s.key), forwards=s.forwards + 1, block=s.block + new_block,
            block_iters=block_iters, accept_hist=s.accept_hist.at[accepted].add(1), stop=stop)

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
    def step(self, params: Params, state: JacobiState) -> JacobiState:
        """One Jacobi iteration (one forward)."""
        return self._step(params, state)

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
    def run_compiled(self, params: Params, state: JacobiState) -> JacobiState:
        """Iterates ``step`` on device until done: iterations and blocks in one ``lax.while_loop``."""
        return jax.lax.while_loop(lambda s: ~s.done, lambda s: self._step(params, s), state)

    def run_python(self, params: Params, state: JacobiState,
                   on_tokens: Callable[[list[int]], None] | None = None,
                   on_step: Callable[[JacobiState, JacobiState], None] | None = None) -> JacobiState:
        """The same step driven from Python: ``on_tokens(new_ids)`` streams, ``on_step(before, after)`` observes."""
        count = 0
        if on_tokens is not None and int(state.count) > 0:
            on_tokens(np.asarray(state.out[: int(state.count)]).tolist())
            count = int(state.count)
        while not bool(state.done):
            before = jax.device_get(state) if on_step is not None else None
            state = self.step(params, state)
            if on_step is not None:
                on_step(before, jax.device_get(state))
            if on_tokens is not None:
                new_count = int(state.count)
                if new_count > count:
                    on_tokens(np.asarray(state.out[count:new_count]).tolist())
                count = new_count
        return state


# ----------------------------------------------------------------------------------------------------------
# Public entry points: decoding and trajectory recording.

@dataclasses.dataclass(frozen=True)
class BlockTrajectory:
    """Every iterate of one block: ``states[0]`` the random draft it started from, ``states[k]`` the n-token view
    ``accepted prefix ++ next draft`` after iteration k (for block 0, state 1 comes from the prefill), and
    ``states[-1]`` the fixed point (the greedy block)."""

    prompt_ids: np.ndarray  # int32 [P_j]: the prompt followed by the fixed points of the earlier blocks
    states: np.ndarray  # int32 [K + 1, n]

    @property
    def fixed_point(self) -> np.ndarray:
        return self.states[-1]


def prepare_request(cfg: ModelConfig, prompts, max_new_tokens: int, block_size: int, lookahead: int):
    """Validates the block size and buckets the prompts (``lookahead`` KV slots for the widest forward)."""
    block_size = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    prep = prepare_prompts(cfg, prompts, max_new_tokens, lookahead=lookahead)
    return block_size, prep


def prompt_key(seed: int, index: int):
    """The draft RNG key of prompt ``index`` of a call with ``seed``."""
    return jax.random.fold_in(jax.random.PRNGKey(check_int("seed", seed, 0, 2**31 - 1)), index)


def record_trajectories(params: Params, cfg: ModelConfig, prompt_ids: Sequence[int], *, block_size: int,
                        max_new_tokens: int, eos_ids: Sequence[int] = (), seed: int = 0) -> list[BlockTrajectory]:
    """Jacobi trajectories of one prompt, block by block (for training data, spec section 2).

    As in trajectory collection, blocks always run to their n-token fixed point (EOS does not cap inside a
    block); generation stops after the first block whose fixed point contains one of ``eos_ids`` or after
    ``ceil(max_new_tokens / n)`` blocks. The states are exactly the iterates of the decoding step.
    """
    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, cfg.max_position_embeddings)
    _, prep = prepare_request(cfg, [prompt_ids], -(-max_new_tokens // n) * n, n, n)  # whole blocks
    eos_set = {int(e) for e in eos_ids}
    decoder = JacobiDecoder(cfg, n)
    params = unstack_layers(params)
    state = decoder.init(params, prep.tokens[0], prep.lengths[0], prompt_key(seed, 0), jnp.int32(prep.max_new_tokens),
                         eos_array(()), prep.out_capacity, prep.cache_capacity)
    host = jax.device_get(state)
    context = np.asarray(prompt_ids, np.int32)
    states = [host.block_init, host.draft]
    blocks: list[BlockTrajectory] = []
    while not bool(host.done):
        before = host
        host = jax.device_get(state := decoder.step(params, state))
        start = int(before.block_start)
        if int(host.count) >= start + n:  # the block reached its fixed point
            fixed = host.out[start: start + n]
            blocks.append(BlockTrajectory(prompt_ids=context, states=np.stack(states + [fixed]).astype(np.int32)))
            context = np.concatenate([context, fixed]).astype(np.int32)
            if eos_set & set(fixed.tolist()):
                break
            states = [host.block_init]
        else:
            view = np.concatenate([host.out[start: int(host.count)], host.draft[: int(host.draft_len)]])
            states.append(view)
    return blocks


def generate_jacobi(params: Params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                    eos_ids: Sequence[int], block_size: int = 64, seed: int = 0, warmup: bool = True,
                    driver: str = "compiled",
                    on_tokens: Callable[[int, list[int]], None] | None = None) -> GenerationResult:
    """Greedy Jacobi decoding of token-id prompts (decoded one after another, each with batch 1; shapes are
    bucketed so new prompts reuse the compiled programs). ``driver="python"`` steps from the host and may
    stream: ``on_tokens(prompt_index, new_ids)``. ``forwards`` counts the prefill; ``stats`` holds per-prompt
    and total statistics."""
    if driver not in DRIVERS:
        raise GenerationError(f"driver must be one of {DRIVERS}, got {driver!r}")
    if on_tokens is not None and driver != "python":
        raise GenerationError("streaming (on_tokens) needs driver='python'")
    n, prep = prepare_request(cfg, prompts, max_new_tokens, block_size, block_size)
    decoder = JacobiDecoder(cfg, n)
    params = unstack_layers(params)
    eos = eos_array(eos_ids)

    def run_one(i: int, max_new: int, stream):
        start = time.perf_counter()
        state = decoder.init(params, prep.tokens[i], prep.lengths[i], prompt_key(seed, i), jnp.int32(max_new), eos,
                             prep.out_capacity, prep.cache_capacity)
        state.count.block_until_ready()
        prefill_done = time.perf_counter()
        if driver == "compiled":
            state = decoder.run_compiled(params, state)
        else:
            state = decoder.run_python(params, state, on_tokens=stream)
        host = jax.device_get(state)
        return host, time.perf_counter() - start, prefill_done - start

    if warmup:
        run_one(0, 1, None)
    token_ids, per_prompt, seconds, prefill_seconds = [], [], 0.0, 0.0
    for i in range(len(prompts)):
        stream = None if on_tokens is None else functools.partial(on_tokens, i)
        host, secs, pre = run_one(i, prep.max_new_tokens, stream)
        seconds, prefill_seconds = seconds + secs, prefill_seconds + pre
        token_ids.append(host.out[: int(host.count)].tolist())
        per_prompt.append(base_stats(host.forwards, host.count, host.block_iters, host.accept_hist, host.stop))
    stats = dict(method="jacobi", block_size=n, driver=driver, seed=seed, per_prompt=per_prompt,
                 total=total_stats(per_prompt, ("forwards", "tokens")))
    return GenerationResult(token_ids=token_ids, forwards=[p["forwards"] for p in per_prompt], seconds=seconds,
                            prefill_seconds=prefill_seconds, stats=stats)
