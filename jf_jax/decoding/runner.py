"""The scaffolding Jacobi and multi-block decoding share: one step function, two drivers, one batched prompt loop.

A block decoder is a frozen, hashable ``BlockDecoder`` (a jit static argument) that defines ``init`` (the prefill)
and ``_step`` (one forward and its bookkeeping) over an all-array loop state of B rows (B prompts decoded
together: one forward serves every row, then each row's bookkeeping runs on its own, under ``jax.vmap``; a
finished row keeps its state, ``keep_if_done``). This module gives every such decoder the same

* drivers: ``run_compiled`` (a ``lax.while_loop`` of the step on device until every row is done, no host round
  trip) and ``run_python`` (the same jitted step from Python: streams accepted tokens and lets an observer see
  every state, which is how the one-prompt recorder records trajectories; the batched recorder,
  ``decoding.batch_recording``, records on device in a loop of its own); a test asserts both give identical tokens;
* request loop ``decode_prompts``: validation of the options, warm-up compilation, the prompts decoded
  ``batch_size`` at a time and timed with and without their prefill, statistics from ``decoding.stats`` and the
  ``GenerationResult``.

A row's tokens do not depend on what else shares its batch: every op of the forward is batch-invariant
(``model.cached_attention``) and the bookkeeping is per row, so batched decoding is lossless per row.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.decoding.common import GenerationError, GenerationResult, PreparedPrompts, batch_slices, prompt_key
from jf_jax.decoding.placement import place_params, place_rows, rows_multiple, traced_on
from jf_jax.decoding.sampling import GREEDY, Sampling, sampling_key
from jf_jax.decoding.shapes import DecodeShape, shape_label
from jf_jax.decoding.stats import prompt_stats, summarize
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import DecodeView, as_decode_view
from jf_jax.model.params import Params

DRIVERS = ("compiled", "python")
MAX_BLOCK_SIZE = 1024

OnTokens = Callable[[int, list[int]], None]
"""Streaming callback: ``on_tokens(prompt_index, new_token_ids)``."""
OnStep = Callable[[int, Any, Any], bool | None]
"""Observer: ``on_step(row, state_before, state_after)`` with host copies of one row of the loop state
(``row_view``), once per forward of a running row; a true return value stops that row (the trajectory
recorder stops after the block holding EOS)."""


def keep_if_done(old, new):
    """``new``, except that a row already done keeps ``old`` (its loop state is final)."""
    return jax.tree.map(lambda a, b: jnp.where(old.done, a, b), old, new)


def per_row(x, batch: int):
    """``x`` (a scalar or array) as int32 repeated for each of ``batch`` rows: [batch, *x.shape]."""
    return jnp.broadcast_to(jnp.asarray(x, jnp.int32), (batch,) + jnp.shape(x))


def row_view(state, row: int):
    """Row ``row`` of a (host) loop state, without the cache: the per-row fields at their one-row shapes."""
    return jax.tree.map(lambda x: x[row], dataclasses.replace(state, cache=None))


@dataclasses.dataclass(frozen=True)
class BlockDecoder:
    """Static half of a block decoder. Subclasses define ``init`` and ``_step``; their loop state has per row at
    least ``out`` [N], ``count`` [], ``done`` [], ``forwards`` [], ``block_iters`` [max_blocks], ``accept_hist``
    [n + 1] and ``stop`` [] (a ``StopReason`` value), and a ``cache`` of B rows."""

    cfg: ModelConfig
    block_size: int
    sampling: Sampling = dataclasses.field(default=GREEDY, kw_only=True)
    """How every token is chosen from its logits (``decoding.sampling``): greedy, or keyed Gumbel-max sampling."""
    shape: DecodeShape | None = dataclasses.field(default=None, kw_only=True)
    """The one shape every decode forward is padded to (``decoding.shapes``); None: each at its natural shape."""

    @property
    def prefill_width(self) -> int | None:
        """The fixed shape's width (the prefill computes the logits of that many positions), or None."""
        return None if self.shape is None else self.shape.width

    def init(self, params, prompts, prompt_lens, keys, sample_keys, max_new, eos_ids, out_capacity: int,
             capacity: int):
        """The prefill: the loop state of B rows; ``keys`` [B, 2] draft keys, ``sample_keys`` [B, 2] sampling keys."""
        raise NotImplementedError

    def _step(self, params, state):
        raise NotImplementedError

    def counters(self, host_row) -> dict[str, int]:
        """Method-specific counters of a finished row (``row_view`` of a host state) for the statistics."""
        return {}

    def row_stats(self, host_row) -> dict:
        """A finished row's block statistics (``decoding.stats.prompt_stats`` arguments beyond tokens, forwards and
        the stop reason)."""
        return dict(block_iters=host_row.block_iters, accept_hist=host_row.accept_hist,
                    counters=self.counters(host_row))

    @decode_jit(static_argnums=0, donate_argnums=2)
    def step(self, params, state):
        """One iteration (one forward of every row)."""
        return self._step(params, state)

    @decode_jit(static_argnums=0, donate_argnums=2)
    def run_compiled(self, params, state):
        """Iterates ``step`` on device until every row is done: iterations and blocks in one ``lax.while_loop``."""
        return jax.lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: self._step(params, s), state)

    def run_python(self, params, state, on_tokens: Callable[[int, list[int]], None] | None = None,
                   on_step: OnStep | None = None):
        """The same step driven from Python: ``on_tokens(row, new_ids)`` streams, ``on_step(row, before, after)``
        observes (see ``OnStep``)."""
        counts = np.zeros(state.done.shape[0], np.int64)

        def stream(out, count):  # host out [B, N], count [B]: the tokens each row accepted since the last call
            for row in range(len(counts)):
                if count[row] > counts[row]:
                    on_tokens(row, out[row, counts[row]:count[row]].tolist())
                counts[row] = count[row]

        if on_tokens is not None:
            stream(*jax.device_get((state.out, state.count)))
        def rows_on_host(s):  # the observer's view: every field but the cache (B rows of KV are not copied out)
            return jax.device_get(dataclasses.replace(s, cache=None))

        while not bool(jnp.all(state.done)):
            before = rows_on_host(state) if on_step is not None else None
            state = self.step(params, state)
            after = rows_on_host(state) if on_step is not None else None
            if on_step is not None:
                stops = [row for row in range(len(counts)) if not before.done[row]
                         and on_step(row, row_view(before, row), row_view(after, row))]
                if stops:
                    state = dataclasses.replace(state, done=state.done.at[np.asarray(stops)].set(True))
            if on_tokens is not None:
                stream(*((after.out, after.count) if after is not None else jax.device_get((state.out, state.count))))
        return state


def check_driver(driver: str, on_tokens, on_step) -> None:
    if driver not in DRIVERS:
        raise GenerationError(f"driver must be one of {DRIVERS}, got {driver!r}")
    if (on_tokens is not None or on_step is not None) and driver != "python":
        raise GenerationError("streaming (on_tokens) and observing (on_step) need driver='python'")


def decode_prompts(decoder: BlockDecoder, params: Params | DecodeView, prep: PreparedPrompts, eos_ids: np.ndarray, *,
                   seed: int, batch_size: int = 1, driver: str = "compiled", warmup: bool = True,
                   on_tokens: OnTokens | None = None, on_step: Callable[[int, Any, Any], bool | None] | None = None,
                   settings: dict | None = None, first_index: int = 0, mesh=None) -> GenerationResult:
    """Decodes every prompt of ``prep`` with ``decoder``, ``batch_size`` prompts at a time, on bucketed shapes
    so batches share the compiled programs (a last, smaller batch is padded with finished rows). Prompt i (of the
    request: ``first_index + i``) draws its drafts from ``prompt_key(seed, first_index + i)`` whatever its batch,
    so its tokens and statistics do not depend on ``batch_size``; it samples (when ``decoder.sampling`` is not
    greedy) with ``sampling_key(seed, first_index + i)``, a stream apart from the drafts'.
    ``on_step(prompt_index, before, after)`` observes the python driver. With a ``mesh`` (``model.sharding``'s
    ``data``, ``fsdp``, ``tensor``; ``placement``) each batch's rows are split over its batch axes (B rounded up to
    fill them) and the weights over ``tensor``, and the programs run traced under it (``placement.traced_on``).

    ``warmup`` first compiles the programs with a 1-token run on the same shapes, so ``seconds`` excludes
    compilation. Prompts decoded together share one wall clock: per-prompt seconds exist only for
    ``batch_size`` 1. ``settings`` are recorded in ``stats`` beside the per-prompt and total statistics.
    ``params`` is a ``DecodeView`` (``api.load_model``'s), or stacked training params converted once here.
    """
    check_driver(driver, on_tokens, on_step)
    params = as_decode_view(params)
    num = prep.tokens.shape[0]
    B, batches = batch_slices(num, batch_size, rows_multiple(mesh))
    params = place_params(mesh, params, decoder.cfg)

    def run_batch(first: int, idx, max_new: int, stream=None, observe=None):
        padding = jnp.asarray(np.arange(first, first + B) >= num)  # rows repeating a prompt: finished from the start
        keys = jnp.stack([prompt_key(seed, first_index + int(i)) for i in idx])
        sample_keys = jnp.stack([sampling_key(seed, first_index + int(i)) for i in idx])
        rows = place_rows(mesh, prep.tokens[idx], prep.lengths[idx], keys, sample_keys)
        start = time.perf_counter()
        with traced_on(mesh):
            state = decoder.init(params, *rows, jnp.int32(max_new), eos_ids, prep.out_capacity, prep.cache_capacity)
            state = dataclasses.replace(state, done=state.done | padding)
            state.count.block_until_ready()
            prefill_done = time.perf_counter()
            if driver == "compiled":
                state = decoder.run_compiled(params, state)
            else:
                state = decoder.run_python(params, state, on_tokens=stream, on_step=observe)
        host = jax.device_get(state)
        return host, time.perf_counter() - start, prefill_done - start

    if warmup:
        run_batch(*batches[0], 1)
    token_ids, per_prompt, seconds, prefill_seconds = [], [], 0.0, 0.0
    for first, idx in batches:
        stream = None if on_tokens is None else (lambda row, ids, first=first: on_tokens(first + row, ids))
        observe = None if on_step is None else (lambda row, a, b, first=first: on_step(first + row, a, b))
        host, batch_seconds, batch_prefill = run_batch(first, idx, prep.max_new_tokens, stream, observe)
        seconds, prefill_seconds = seconds + batch_seconds, prefill_seconds + batch_prefill
        timing = dict(seconds=batch_seconds, prefill_seconds=batch_prefill) if B == 1 else {}
        for row in range(min(B, num - first)):
            r = row_view(host, row)
            token_ids.append(r.out[: int(r.count)].tolist())
            per_prompt.append(prompt_stats(tokens=r.count, forwards=r.forwards, stop=r.stop, **decoder.row_stats(r),
                                           **timing))
    # Alone, each prompt carries its own seconds (summed, with their median); batched, the batches' wall clocks.
    total = summarize(per_prompt) if B == 1 else summarize(per_prompt, seconds=seconds,
                                                             prefill_seconds=prefill_seconds)
    stats = dict(**(settings or {}), block_size=decoder.block_size, batch_size=B, driver=driver, seed=seed,
                 decode_shape=shape_label(decoder.shape),
                 **decoder.sampling.describe(),
                 per_prompt=per_prompt, total=total)
    return GenerationResult(token_ids=token_ids, forwards=[p["forwards"] for p in per_prompt],
                            seconds=total["seconds"], prefill_seconds=total["prefill_seconds"], stats=stats)
