"""Batched trajectory recording: every block of many responses as rows of batched programs, with no prefill of
the blocks' contexts.

The one-prompt recorder (``decoding.recording.record_trajectories``) walks one response block by block. Nothing in
the method needs that order: the fixed point of every block is the greedy AR continuation, so once the response is
known, block k is an independent n-token Jacobi decode of ``prompt ++ response[:k*n]``. Per batch of prompts:

1. **The responses** by batched AR (``decoding.ar.ARDecoder``). Its final KV cache holds every position of
   ``prompt ++ response[:-1]``, computed one token per forward.
2. **Block 0** of every response starts as the one-prompt decoder starts it: the prefill-drafting trick over the
   prompt (``JacobiDecoder.init`` with the AR batch's own prompt arrays).
3. **Block k > 0** starts from the AR cache cut at the block's first position (``BlockResume.resume``): the
   one-prompt decoder's exact state when it begins that block (the same committed tokens, the same cache
   lengths, the draft ``[response[k*n]] ++ (n-1) ids drawn with blocks.block_key(prompt key, k*n)``). No
   context is forwarded again: a row costs only its Jacobi iterations.
4. Every row iterates the Jacobi step to its n-token fixed point in one compiled loop that records each iterate
   on device (``BlockResume.run_recording``), so the host waits once per batch of rows, not once per iteration.

Why the rows' iterates are the one-prompt decoder's: a committed token's key and value depend only on the token,
its position and the keys before it, and the decode forward gives a token the same bits whatever else the forward
holds (on the CPU by construction, ``model.cached_attention``; on GPUs and TPUs by running AR and the block rows
at one ``DecodeShape``, ``decoding.shapes``). So the AR pass's cache is, bit for bit, the cache the one-prompt
decoder would have built, and the block's iterates follow. A block whose fixed point still differs from the AR
response is counted (``ResponseTrajectories.mismatched``) and the response's later blocks are dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.decoding.ar import ARDecoder
from jf_jax.decoding.blocks import block_key, draw_context
from jf_jax.decoding.common import MAX_BATCH_SIZE, check_int, eos_array, prepare_prompts, prompt_key
from jf_jax.decoding.jacobi import JacobiDecoder, JacobiState
from jf_jax.decoding.placement import local_rows_mesh, place_params, place_rows, rows_multiple, traced_on
from jf_jax.decoding.recording import BlockTrajectory
from jf_jax.decoding.runner import MAX_BLOCK_SIZE
from jf_jax.decoding.shapes import DecodeShape
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import as_decode_view
from jf_jax.model.kv_cache import KVCache


@dataclasses.dataclass(frozen=True)
class ResponseTrajectories:
    """The recorded blocks of one prompt (``blocks``, in order) and how the batched recorder got them."""

    blocks: list[BlockTrajectory]
    mismatched: bool = False
    """A block's Jacobi fixed point differed from the batched AR response (a backend on which the two programs
    give a token different bits): the blocks after it are dropped, since their contexts were not this decoder's."""


@dataclasses.dataclass(frozen=True)
class BlockResume(JacobiDecoder):
    """Jacobi decoding that starts rows at any block of a known greedy response, from the AR pass's cache."""

    @decode_jit(static_argnums=0)
    def resume(self, cache: KVCache, prompts, prompt_lens, responses, keys, rows, starts) -> JacobiState:
        """Rows ``rows`` [R] of an AR batch (its ``cache``, ``prompts`` [B, P], ``prompt_lens`` [B], greedy
        ``responses`` [B, N] and draft ``keys`` [B, 2]), row i at the block beginning at output ``starts[i]``
        (a positive multiple of n): the state the one-prompt Jacobi decoder is in when it begins that block,
        decoding until the block's end."""
        n = self.block_size
        R = rows.shape[0]
        take = lambda x: jnp.take(x, rows, axis=0)  # noqa: E731
        prompts, prompt_lens, keys, responses = take(prompts), take(prompt_lens), take(keys), take(responses)
        out = jnp.where(jnp.arange(responses.shape[1]) < starts[:, None], responses, -1)

        def block_draft(key, prompt, prompt_len, out, response, start):
            drawn = draw_context(block_key(key, start), prompt, prompt_len, out, start, n - 1)
            return jnp.concatenate([response[start][None], drawn])

        draft = jax.vmap(block_draft)(keys, prompts, prompt_lens, out, responses, starts)
        kept = KVCache(k=jnp.take(cache.k, rows, axis=1), v=jnp.take(cache.v, rows, axis=1),
                       lengths=prompt_lens + starts)
        zeros = jnp.zeros((R,), jnp.int32)
        return JacobiState(
            draft=draft, draft_len=zeros + n, block_init=draft, out=out, count=starts, block_start=starts,
            done=jnp.zeros((R,), bool), cache=kept, prompt=prompts, prompt_len=prompt_lens, key=keys,
            sample_key=jnp.zeros_like(keys), max_new=starts + n,
            eos_ids=jnp.broadcast_to(jnp.asarray(eos_array(())), (R, 8)), forwards=zeros, block=starts // n,
            block_iters=jnp.zeros((R, responses.shape[1] // n + 2), jnp.int32),
            accept_hist=jnp.zeros((R, n + 1), jnp.int32), stop=zeros)

    @decode_jit(static_argnums=0, donate_argnums=3)
    def run_recording(self, params, state: JacobiState, iterates, num):
        """Iterates every row to its block's fixed point in one ``lax.while_loop``, appending each running row's
        iterate to ``iterates`` [R, n + 2, n] at ``num`` [R] (its count so far): the view ``recording.iterate_view``
        takes on the host, ``accepted prefix ++ next draft`` and last the fixed point. A block of n tokens takes at
        most n iterations, each accepting at least one token, so n + 2 slots hold block 0's draft, its prefill's
        first iterate and every iteration."""
        n = self.block_size
        j = jnp.arange(n)

        def view(out, start, count, draft):
            accepted = count - start
            return jnp.where(j < accepted, out[jnp.clip(start + j, 0, out.shape[0] - 1)],
                             draft[jnp.clip(j - accepted, 0, n - 1)])

        def body(carry):
            s, iterates, num = carry
            new = self._step(params, s)
            views = jax.vmap(view)(new.out, s.block_start, new.count, new.draft)
            slot = jnp.where(s.done, iterates.shape[1], num)  # rows done before this iteration record nothing
            iterates = jax.vmap(lambda rows, i, v: rows.at[i].set(v, mode="drop"))(iterates, slot, views)
            return new, iterates, num + ~s.done

        _, iterates, num = jax.lax.while_loop(lambda c: ~jnp.all(c[0].done), body, (state, iterates, num))
        return iterates, num


def record_batch(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, block_size: int,
                 max_new_tokens: int, eos_ids: Sequence[int] = (), seed: int = 0,
                 prompt_indices: Sequence[int] | None = None, batch_size: int = 8,
                 decode_shape: DecodeShape | None = None, mesh=None) -> list[ResponseTrajectories]:
    """``record_trajectories`` of many prompts at once: the same blocks, computed as rows of batched programs.

    Prompts are taken ``batch_size`` at a time (shortest first, so a batch's prompts share a length bucket); per
    batch, the greedy responses by AR, then every block of every response as a row of ``batch_size``-row Jacobi
    programs (the module docstring). Prompt i draws its drafts from ``prompt_key(seed, prompt_indices[i])``
    (default: i), as ``record_trajectories`` with ``prompt_index`` does, so every block's trajectory is the
    sequential recorder's, whatever the batching. ``decode_shape`` pads AR's and the blocks' forwards to one shape
    (``decoding.shapes``; what GPUs and TPUs need). With several local devices each batch's rows are split over
    them (``batch_size`` is rounded up to a multiple of the device count); a ``mesh`` (``model.sharding``) splits
    rows over its batch axes and the weights over ``tensor`` instead (``decoding.placement``).
    """
    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    whole_blocks = -(-check_int("max_new_tokens", max_new_tokens, 1, cfg.max_position_embeddings) // n) * n
    if decode_shape is not None:
        decode_shape.check_covers("the trajectory recorder", 1, n)
    mesh = local_rows_mesh() if mesh is None else mesh
    # no more rows than prompts (rounded up to fill the devices): a CPU forward costs in proportion to its rows
    rows = min(check_int("batch_size", batch_size, 1, MAX_BATCH_SIZE), max(len(prompts), 1))
    batch_size = -(-rows // rows_multiple(mesh)) * rows_multiple(mesh)
    indices = list(range(len(prompts))) if prompt_indices is None else [int(i) for i in prompt_indices]
    if len(indices) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(indices)} prompt_indices")
    params = place_params(mesh, as_decode_view(params), cfg)
    recorder = _Recorder(params, cfg, n, whole_blocks, decode_shape, mesh, eos_ids, batch_size)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    results: dict[int, ResponseTrajectories] = {}
    for first in range(0, len(order), batch_size):
        chunk = order[first: first + batch_size]
        with traced_on(mesh):  # the CPU kernels' calls on each device's rows and heads (``placement.traced_on``)
            batch = recorder.record([prompts[i] for i in chunk], [prompt_key(seed, indices[i]) for i in chunk])
        results.update(zip(chunk, batch))
    return [results[i] for i in range(len(prompts))]


@dataclasses.dataclass(frozen=True)
class _Recorder:
    """The settings of one ``record_batch`` call, and its per-batch work."""

    params: object
    cfg: ModelConfig
    n: int
    whole_blocks: int
    shape: DecodeShape | None
    mesh: object
    eos_ids: Sequence[int]
    batch_size: int

    def record(self, prompts: list, keys: list) -> list[ResponseTrajectories]:
        """One batch of at most ``batch_size`` prompts: AR, then every block of every response."""
        B, n, real = self.batch_size, self.n, len(prompts)
        padded = list(prompts) + [prompts[-1]] * (B - real)  # finished from the start: one shape per bucket
        keys = jnp.stack(list(keys) + [keys[-1]] * (B - real))
        prep = prepare_prompts(self.cfg, padded, self.whole_blocks, lookahead=n if self.shape is None else
                               self.shape.width)
        tokens, lengths, keys = place_rows(self.mesh, prep.tokens, prep.lengths, keys)
        ar = ARDecoder(self.cfg, 1, shape=self.shape)
        state = ar.init(self.params, tokens, lengths, keys, jnp.zeros_like(keys), jnp.int32(self.whole_blocks),
                        eos_array(self.eos_ids), prep.out_capacity, prep.cache_capacity)
        state = dataclasses.replace(state, done=state.done | jnp.asarray(np.arange(B) >= real))
        state = ar.run_compiled(self.params, state)
        out, count = jax.device_get((state.out, state.count))
        responses = [np.asarray(out[i, : count[i]], np.int32) for i in range(real)]

        blocks = BlockResume(self.cfg, n, shape=self.shape)
        # block 0's state (and its cache) lives only for its own iterations
        by_block = {(i, 0): iterates for i, iterates in enumerate(self._iterate(
            blocks, blocks.init(self.params, tokens, lengths, keys, jnp.zeros_like(keys), jnp.int32(n),
                                eos_array(()), prep.out_capacity, prep.cache_capacity), np.zeros(B, np.int64))[:real])}
        later = [(i, k) for i in range(real) for k in range(1, -(-len(responses[i]) // n))]
        for start in range(0, len(later), B):
            chunk = later[start: start + B]
            chunk = chunk + [chunk[-1]] * (B - len(chunk))  # repeated rows: one compiled shape
            rows = np.asarray([i for i, _ in chunk], np.int32)
            starts = np.asarray([k * n for _, k in chunk], np.int32)
            resumed = blocks.resume(state.cache, tokens, lengths, state.out, keys,
                                    *place_rows(self.mesh, rows, starts))
            by_block.update(zip(chunk, self._iterate(blocks, resumed, starts)))
        return [self._response(prompts[i], responses[i],
                               [by_block[(i, k)] for k in range(-(-len(responses[i]) // n))]) for i in range(real)]

    def _iterate(self, decoder: BlockResume, state: JacobiState, starts) -> list[np.ndarray]:
        """Runs rows to their blocks' fixed points on device (``BlockResume.run_recording``: no host round trip
        per iteration); per row every iterate, [K + 1, n]."""
        n = self.n
        block_init, draft = state.block_init, state.draft
        first = jnp.asarray(starts == 0)  # block 0's prefill already made its first iterate
        iterates = jnp.zeros((len(starts), n + 2, n), jnp.int32).at[:, 0].set(block_init)
        iterates = iterates.at[:, 1].set(jnp.where(first[:, None], draft, 0))
        num = jnp.where(first, 2, 1).astype(jnp.int32)
        iterates, num = jax.device_get(decoder.run_recording(self.params, state, iterates, num))
        if not (num <= n + 2).all():  # a trajectory cut before its fixed point would pass as a shorter one
            raise AssertionError(f"a block recorded {num.max()} iterates, more than the {n + 2} an n-token block can")
        return [iterates[r, : num[r]] for r in range(len(starts))]

    def _response(self, prompt, response: np.ndarray, block_iterates: list[np.ndarray]) -> ResponseTrajectories:
        """A response's blocks in order, up to the block holding EOS or the first that disagrees with AR."""
        n, eos = self.n, {int(e) for e in self.eos_ids}
        blocks = []
        for k, states in enumerate(block_iterates):
            context = np.concatenate([np.asarray(prompt, np.int32), response[: k * n]])
            blocks.append(BlockTrajectory(prompt_ids=context, states=states))
            expected = response[k * n: (k + 1) * n]
            if not np.array_equal(states[-1][: len(expected)], expected):
                return ResponseTrajectories(blocks=blocks, mismatched=True)
            if eos & set(states[-1].tolist()):
                break
        return ResponseTrajectories(blocks=blocks)
