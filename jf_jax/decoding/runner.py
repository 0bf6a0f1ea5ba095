"""The scaffolding Jacobi and multi-block decoding share: one step function, two drivers, one per-prompt loop.

A block decoder is a frozen, hashable ``BlockDecoder`` (a jit static argument) that defines ``init`` (the prefill)
and ``_step`` (one forward and its bookkeeping) over an all-array loop state. This module gives every such
decoder the same

* drivers: ``run_compiled`` (a ``lax.while_loop`` of the step on device, no host round trip) and
  ``run_python`` (the same jitted step from Python: streams accepted tokens and lets an observer see every
  state, which is how trajectories are recorded); a test asserts both give identical tokens;
* request loop ``decode_prompts``: validation of the driver options, warm-up compilation, each prompt decoded
  with batch 1 and timed with and without its prefill, statistics from ``decoding.stats`` and the
  ``GenerationResult``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.decoding.common import GenerationError, GenerationResult, PreparedPrompts, prompt_key
from jf_jax.decoding.stats import prompt_stats, summarize
from jf_jax.model.config import ModelConfig

DRIVERS = ("compiled", "python")
MAX_BLOCK_SIZE = 1024

OnTokens = Callable[[int, list[int]], None]
"""Streaming callback: ``on_tokens(prompt_index, new_token_ids)``."""
OnStep = Callable[[Any, Any], bool | None]
"""Observer: ``on_step(state_before, state_after)`` with host copies of the loop state, once per forward; a true
return value stops the driver early (the trajectory recorder stops after the block holding EOS)."""


@dataclasses.dataclass(frozen=True)
class BlockDecoder:
    """Static half of a block decoder. Subclasses define ``init`` and ``_step``; their loop state has at least
    ``out`` [N], ``count`` [], ``done`` [], ``forwards`` [], ``block_iters`` [max_blocks], ``accept_hist``
    [n + 1] and ``stop`` [] (a ``StopReason`` value)."""

    cfg: ModelConfig
    block_size: int

    def init(self, params, prompt, prompt_len, key, max_new, eos_ids, out_capacity: int, capacity: int):
        raise NotImplementedError

    def _step(self, params, state):
        raise NotImplementedError

    def counters(self, host_state) -> dict[str, int]:
        """Method-specific counters of a finished state (host values) for the statistics."""
        return {}

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
    def step(self, params, state):
        """One iteration (one forward)."""
        return self._step(params, state)

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
    def run_compiled(self, params, state):
        """Iterates ``step`` on device until done: iterations and blocks in one ``lax.while_loop``."""
        return jax.lax.while_loop(lambda s: ~s.done, lambda s: self._step(params, s), state)

    def run_python(self, params, state, on_tokens: Callable[[list[int]], None] | None = None,
                   on_step: OnStep | None = None):
        """The same step driven from Python: ``on_tokens(new_ids)`` streams, ``on_step(before, after)`` observes
        (see ``OnStep``)."""
        count = 0
        if on_tokens is not None and int(state.count) > 0:
            on_tokens(np.asarray(state.out[: int(state.count)]).tolist())
            count = int(state.count)
        while not bool(state.done):
            before = jax.device_get(state) if on_step is not None else None
            state = self.step(params, state)
            stop_early = on_step is not None and on_step(before, jax.device_get(state))
            if on_tokens is not None:
                new_count = int(state.count)
                if new_count > count:
                    on_tokens(np.asarray(state.out[count:new_count]).tolist())
                count = new_count
            if stop_early:
                break
        return state


def check_driver(driver: str, on_tokens, on_step) -> None:
    if driver not in DRIVERS:
        raise GenerationError(f"driver must be one of {DRIVERS}, got {driver!r}")
    if (on_tokens is not None or on_step is not None) and driver != "python":
        raise GenerationError("streaming (on_tokens) and observing (on_step) need driver='python'")


def decode_prompts(decoder: BlockDecoder, params, prep: PreparedPrompts, eos_ids: np.ndarray, *, seed: int,
                   driver: str = "compiled", warmup: bool = True, on_tokens: OnTokens | None = None,
                   on_step: Callable[[int, Any, Any], bool | None] | None = None,
                   settings: dict | None = None) -> GenerationResult:
    """Decodes every prompt of ``prep`` with ``decoder`` (batch 1, one after another, on bucketed shapes so
    prompts share the compiled programs). ``on_step(prompt_index, before, after)`` observes the python driver.

    ``warmup`` first compiles the programs with a 1-token run on the same shapes, so ``seconds`` excludes
    compilation. ``settings`` are recorded in ``stats`` beside the per-prompt and total statistics.
    """
    check_driver(driver, on_tokens, on_step)

    def run_one(i: int, max_new: int, stream=None, observe=None):
        start = time.perf_counter()
        state = decoder.init(params, prep.tokens[i], prep.lengths[i], prompt_key(seed, i), jnp.int32(max_new),
                             eos_ids, prep.out_capacity, prep.cache_capacity)
        state.count.block_until_ready()
        prefill_done = time.perf_counter()
        if driver == "compiled":
            state = decoder.run_compiled(params, state)
        else:
            state = decoder.run_python(params, state, on_tokens=stream, on_step=observe)
        host = jax.device_get(state)
        return host, time.perf_counter() - start, prefill_done - start

    if warmup:
        run_one(0, 1)
    token_ids, per_prompt = [], []
    for i in range(prep.tokens.shape[0]):
        stream = None if on_tokens is None else functools.partial(on_tokens, i)
        observe = None if on_step is None else functools.partial(on_step, i)
        host, seconds, prefill_seconds = run_one(i, prep.max_new_tokens, stream, observe)
        token_ids.append(host.out[: int(host.count)].tolist())
        per_prompt.append(prompt_stats(tokens=host.count, forwards=host.forwards, stop=host.stop, seconds=seconds,
                                       prefill_seconds=prefill_seconds, block_iters=host.block_iters,
                                       accept_hist=host.accept_hist, counters=decoder.counters(host)))
    total = summarize(per_prompt)
    stats = dict(**(settings or {}), block_size=decoder.block_size, driver=driver, seed=seed,
                 per_prompt=per_prompt, total=total)
    return GenerationResult(token_ids=token_ids, forwards=[p["forwards"] for p in per_prompt],
                            seconds=total["seconds"], prefill_seconds=total["prefill_seconds"], stats=stats)
