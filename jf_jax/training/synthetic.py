"""A synthetic task with fake Jacobi trajectories, for smoke runs and tests of the training pipeline.

Token ids: 0 = PAD, 1 = EOS, 2 unused, 3 .. V-1 = content. A prompt is ``prompt_len`` content tokens; its
response continues it as ``r[k] = 3 + (x[k mod P] - 3 + k // P + 1) mod (V - 3)`` (a shifted copy) and ends
with EOS somewhere in its last block; the rest of that block is junk, as from a real collector.

``SyntheticRecorder`` stands in for the Jacobi recording driver: ``record_fn(prompt_ids)`` returns, per
block, states shaped like real iterates: state 0 = [correct first token] + tokens drawn from the context,
then ``accepted prefix ++ draft`` with the accepted prefix growing by 1-3 tokens per iteration, and the fixed
point last. It is deterministic in the prompt, so resumed collections reproduce it.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

PAD_ID, EOS_ID, FIRST_CONTENT_ID = 0, 1, 3


def make_prompts(num_prompts: int, prompt_len: int, vocab_size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(FIRST_CONTENT_ID, vocab_size, prompt_len).astype(np.int32) for _ in range(num_prompts)]


def response_for(prompt, length: int, vocab_size: int) -> np.ndarray:
    prompt = np.asarray(prompt)
    k = np.arange(length)
    span = vocab_size - FIRST_CONTENT_ID
    shifted = (prompt[k % prompt.size] - FIRST_CONTENT_ID + k // prompt.size + 1) % span
    return (FIRST_CONTENT_ID + shifted).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class SyntheticRecorder:
    block_size: int
    num_blocks: int
    vocab_size: int

    def __call__(self, prompt_ids) -> list[np.ndarray]:
        prompt = np.asarray(prompt_ids, np.int32)
        n, T = self.block_size, self.num_blocks
        rng = np.random.default_rng(zlib.crc32(prompt.tobytes()))
        eos_at = (T - 1) * n + int(rng.integers(0, n))  # response index of EOS (in the last block)
        response = response_for(prompt, T * n, self.vocab_size)
        response[eos_at] = EOS_ID
        response[eos_at + 1:] = rng.integers(FIRST_CONTENT_ID, self.vocab_size, T * n - eos_at - 1)
        blocks, context = [], prompt
        for j in range(T):
            fixed = response[j * n:(j + 1) * n]
            states = [np.concatenate([fixed[:1], rng.choice(context, n - 1)])]
            accepted = 1
            while accepted < n:
                accepted = min(n, accepted + int(rng.integers(1, 4)))
                draft = rng.choice(context, n - accepted)
                correct = rng.random(n - accepted) < 0.3  # some draft tokens happen to be right already
                draft = np.where(correct, fixed[accepted:], draft)
                states.append(np.concatenate([fixed[:accepted], draft]))
            states[-1] = fixed.copy()
            blocks.append(np.stack(states).astype(np.int32))
            context = np.concatenate([context, fixed])
        return blocks
