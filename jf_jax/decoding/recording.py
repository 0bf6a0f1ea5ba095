"""Jacobi trajectories for training (docs/method.md, section 2): every iterate of every block, recorded by observing the
Python driver of the very decoder that decodes (``decoding.jacobi``), so the states are exactly its iterates."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.decoding.blocks import block_key, draw_context
from jf_jax.decoding.common import MAX_BATCH_SIZE, check_int, eos_array, prepare_prompts, prompt_key
from jf_jax.decoding.jacobi import JacobiDecoder, JacobiState
from jf_jax.decoding.placement import local_rows_mesh, place_rows, replicate, rows_multiple
from jf_jax.decoding.runner import MAX_BLOCK_SIZE
from jf_jax.decoding.sampling import sampling_key
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import DecodeView, as_decode_view
from jf_jax.model.params import Params


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


def iterate_view(out, start: int, count: int, draft, draft_len: int, n: int) -> tuple[np.ndarray, bool]:
    """A block's trajectory state after an iteration, from one row's host state (its block began at output
    ``start``): while it iterates, the n-token view ``accepted prefix ++ next draft``; once ``count`` reaches
    ``start + n``, its fixed point (second value True)."""
    if count < start + n:
        return np.concatenate([out[start:count], draft[:draft_len]]), False
    return out[start: start + n], True


def record_trajectories(params: Params | DecodeView, cfg: ModelConfig, prompt_ids: Sequence[int], *, block_size: int,
                        max_new_tokens: int, eos_ids: Sequence[int] = (), seed: int = 0,
                        prompt_index: int = 0) -> list[BlockTrajectory]:
    """Jacobi trajectories of one prompt, block by block.

    As in trajectory collection, blocks always run to their n-token fixed point (EOS does not cap inside a
    block); generation stops after the first block whose fixed point contains one of ``eos_ids`` or after
    ``ceil(max_new_tokens / n)`` blocks. Drafts are drawn from ``prompt_key(seed, prompt_index)``.
    """
    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, cfg.max_position_embeddings)
    prep = prepare_prompts(cfg, [prompt_ids], -(-max_new_tokens // n) * n, lookahead=n)  # whole blocks
    eos_set = {int(e) for e in eos_ids}
    decoder = JacobiDecoder(cfg, n)
    params = as_decode_view(params)
    # The decoder itself sees no EOS ids: blocks run to their fixed points; the recorder stops at the EOS block.
    state = decoder.init(params, prep.tokens, prep.lengths, prompt_key(seed, prompt_index)[None],
                         sampling_key(seed, prompt_index)[None],
                         jnp.int32(prep.max_new_tokens), eos_array(()), prep.out_capacity, prep.cache_capacity)
    context = np.asarray(prompt_ids, np.int32)
    states = [np.asarray(state.block_init[0]), np.asarray(state.draft[0])]
    blocks: list[BlockTrajectory] = []

    def observe(row: int, before: JacobiState, after: JacobiState) -> bool:
        nonlocal context, states
        view, fixed_point = iterate_view(after.out, int(before.block_start), int(after.count), after.draft,
                                         int(after.draft_len), n)
        if not fixed_point:
            states.append(view)
            return False
        fixed = view
        blocks.append(BlockTrajectory(prompt_ids=context, states=np.stack(states + [fixed]).astype(np.int32)))
        context = np.concatenate([context, fixed]).astype(np.int32)
        states = [after.block_init]
        return bool(eos_set & set(fixed.tolist()))

    decoder.run_python(params, state, on_step=observe)
    return blocks


# ----------------------------------------------------------------------------------------------------------
# Batched recording: greedy responses first, then every block of every response as its own row.

@dataclasses.dataclass(frozen=True)
class ResponseTrajectories:
    """The recorded blocks of one prompt (``blocks``, in order) and how the batched recorder got them."""

    blocks: list[BlockTrajectory]
    mismatched: bool = False
    """A block's Jacobi fixed point differed from the batched AR response (a backend whose logits depend on the
    forward's shape): the blocks after it are dropped, since their contexts were not this decoder's own."""


@dataclasses.dataclass(frozen=True)
class OneBlockJacobi(JacobiDecoder):
    """Jacobi decoding of exactly one block per row, at any block of a known greedy response.

    Row r decodes block k of its response from the context ``prompt ++ response[:k*n]``: block 0 starts like any
    Jacobi decode (the prefill-drafting trick), a later block from ``[response[k*n]] ++ (n-1) context ids drawn with
    block_key(prompt key, k*n)``: the bonus token and the draft the one-prompt decoder starts that block with
    (``JacobiDecoder._advance``). Its iterates are then the one-prompt decoder's: the forward is row-invariant
    (``model.cached_attention``), so a token's logits do not depend on whether the context came from a prefill
    or from earlier blocks."""

    @decode_jit(static_argnums=(0, 7, 8))
    def init_blocks(self, params, contexts, context_lens, keys, block_starts, first_tokens, out_capacity: int,
                    capacity: int) -> JacobiState:
        n = self.block_size
        s = JacobiDecoder.init(self, params, contexts, context_lens, keys, jnp.zeros_like(keys), jnp.int32(n),
                               jnp.asarray(eos_array(())), out_capacity, capacity)

        def later_block_draft(key, context, length, out, start, first):
            drawn = draw_context(block_key(key, start), context, length, out, 0, n - 1)
            return jnp.concatenate([first[None], drawn])

        later = jax.vmap(later_block_draft)(keys, contexts, context_lens, s.out, block_starts, first_tokens)
        is_later = (block_starts > 0)[:, None]
        return dataclasses.replace(s, draft=jnp.where(is_later, later, s.draft),
                                   block_init=jnp.where(is_later, later, s.block_init))


def greedy_responses(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, block_size: int,
                     max_new_tokens: int, eos_ids: Sequence[int] = (), batch_size: int = 8,
                     mesh=None) -> list[np.ndarray]:
    """Each prompt's greedy response by batched AR, up to its first EOS or ``ceil(max_new_tokens / n) * n``
    tokens: the fixed points the sequential recorder reaches, and the first token of every block."""
    from jf_jax.decoding.ar import generate_ar  # deferred: ar imports the runner, as this module does

    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    whole_blocks = -(-check_int("max_new_tokens", max_new_tokens, 1, cfg.max_position_embeddings) // n) * n
    result = generate_ar(params, cfg, prompts, max_new_tokens=whole_blocks, eos_ids=eos_ids,
                         batch_size=min(batch_size, len(prompts)), warmup=False, mesh=mesh)
    return [np.asarray(t, np.int32) for t in result.token_ids]


def record_batch(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, block_size: int,
                 max_new_tokens: int, eos_ids: Sequence[int] = (), seed: int = 0,
                 prompt_indices: Sequence[int] | None = None, batch_size: int = 8) -> list[ResponseTrajectories]:
    """``record_trajectories`` of many prompts at once: the same blocks, computed as rows of batched programs.

    First every response by batched AR (``greedy_responses``); then every block of every response is one row of
    a batched ``OneBlockJacobi`` program, ``batch_size`` rows per forward, rows sorted by context length. Prompt i
    draws its drafts from ``prompt_key(seed, prompt_indices[i])`` (default: i), as ``record_trajectories`` with
    ``prompt_index`` does, so every block's trajectory is the sequential recorder's, whatever the batching.
    With several local devices, each batch's rows are split over them (``placement``; ``batch_size`` is rounded
    up to a multiple of the device count).
    """
    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    mesh = local_rows_mesh()
    batch_size = -(-check_int("batch_size", batch_size, 1, MAX_BATCH_SIZE) // rows_multiple(mesh)) * rows_multiple(mesh)
    indices = list(range(len(prompts))) if prompt_indices is None else [int(i) for i in prompt_indices]
    if len(indices) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(indices)} prompt_indices")
    params = replicate(mesh, as_decode_view(params))
    eos_set = {int(e) for e in eos_ids}
    responses = greedy_responses(params, cfg, prompts, block_size=n, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                                 batch_size=batch_size, mesh=mesh)
    rows = [(i, k) for i, r in enumerate(responses) for k in range(-(-len(r) // n))]  # (prompt, block)
    contexts = {(i, k): np.concatenate([np.asarray(prompts[i], np.int32), responses[i][: k * n]]) for i, k in rows}
    rows.sort(key=lambda row: (len(contexts[row]), row))
    trajectories: dict[tuple[int, int], BlockTrajectory] = {}
    for first in range(0, len(rows), batch_size):
        chunk = rows[first: first + batch_size]
        chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one compiled shape per context bucket
        states = _iterate_blocks(params, cfg, n, mesh, [contexts[r] for r in chunk],
                                 [prompt_key(seed, indices[i]) for i, _ in chunk], [k * n for _, k in chunk],
                                 [int(responses[i][k * n]) if k else 0 for i, k in chunk])
        for row, row_states in zip(chunk, states):
            trajectories[row] = BlockTrajectory(prompt_ids=contexts[row], states=row_states)
    out = []
    for i, response in enumerate(responses):
        blocks, mismatched = [], False
        for k in range(-(-len(response) // n)):
            block = trajectories[(i, k)]
            blocks.append(block)
            expected = response[k * n: (k + 1) * n]
            if not np.array_equal(block.fixed_point[: len(expected)], expected):
                mismatched = True
                break
            if eos_set & set(block.fixed_point.tolist()):
                break
        out.append(ResponseTrajectories(blocks=blocks, mismatched=mismatched))
    return out


def _iterate_blocks(params, cfg: ModelConfig, n: int, mesh, contexts, keys, block_starts,
                    first_tokens) -> list[np.ndarray]:
    """Runs one ``OneBlockJacobi`` batch to its fixed points; per row every iterate, [K + 1, n]."""
    prep = prepare_prompts(cfg, contexts, n, lookahead=n)
    decoder = OneBlockJacobi(cfg, n)
    rows = place_rows(mesh, prep.tokens, prep.lengths, jnp.stack(keys), jnp.asarray(block_starts, jnp.int32),
                      jnp.asarray(first_tokens, jnp.int32))
    state = decoder.init_blocks(params, *rows, prep.out_capacity, prep.cache_capacity)
    block_init, draft, starts = jax.device_get((state.block_init, state.draft, np.asarray(block_starts)))
    states = [[block_init[r]] + ([draft[r]] if starts[r] == 0 else []) for r in range(len(contexts))]
    running = np.ones(len(contexts), bool)
    while running.any():
        state = decoder.step(params, state)
        out, count, draft, draft_len = jax.device_get((state.out, state.count, state.draft, state.draft_len))
        for r in np.flatnonzero(running):
            view, fixed_point = iterate_view(out[r], 0, int(count[r]), draft[r], int(draft_len[r]), n)
            states[r].append(view)
            running[r] = not fixed_point
    return [np.stack(s).astype(np.int32) for s in states]
