"""Jacobi trajectories for training (docs/method.md, section 2): every iterate of every block, recorded by observing the
Python driver of the very decoder that decodes (``decoding.jacobi``), so the states are exactly its iterates."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jf_jax.decoding.common import check_int, eos_array, prepare_prompts, prompt_key
from jf_jax.decoding.jacobi import JacobiDecoder, JacobiState
from jf_jax.decoding.runner import MAX_BLOCK_SIZE
from jf_jax.decoding.sampling import sampling_key
from jf_jax.model.config import ModelConfig
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
