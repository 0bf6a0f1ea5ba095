"""Jacobi decoding is lossless (float32 tokens == greedy AR tokens), both drivers agree, EOS is handled in every
place it can appear, multi-token acceptance really happens on a predictable model, and the recorded
trajectories are the true Jacobi iterates."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.recording import record_trajectories
from jf_jax.decoding.stats import without_timings
from tests.support.decoding_models import (CFG, MAX_NEW, MAX_PROMPT, VOCAB, ar_tokens, cycle_map, eos_cases,
                                           jacobi_update, random_params, successor_params)

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision

BLOCK_SIZES = (1, 3, 8)  # each compiles its own programs: keep the list short


def _jacobi(params, prompt, max_new, eos=(), driver="compiled", **kw):
    return generate_jacobi(params, CFG, [list(prompt)], max_new_tokens=max_new, eos_ids=list(eos), warmup=False,
                           driver=driver, **kw)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 4.0, 10.0]),
       prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT),
       block_size=st.sampled_from(BLOCK_SIZES), max_new=st.integers(1, MAX_NEW),
       eos=st.one_of(st.just(()), st.tuples(st.integers(0, VOCAB - 1))), draft_seed=st.integers(0, 3))
def test_jacobi_equals_ar_and_drivers_agree(seed, scale, prompt, block_size, max_new, eos, draft_seed):
    params = random_params(seed, scale)
    expected = ar_tokens(params, prompt, max_new, eos)
    compiled = _jacobi(params, prompt, max_new, eos, block_size=block_size, seed=draft_seed)
    streamed = []
    python = _jacobi(params, prompt, max_new, eos, driver="python", block_size=block_size, seed=draft_seed,
                     on_tokens=lambda i, ids: streamed.extend(ids))
    assert compiled.token_ids[0] == expected
    assert python.token_ids[0] == expected
    assert streamed == expected
    # Same step, same RNG: the two drivers agree on every statistic too.
    assert ([without_timings(p) for p in python.stats["per_prompt"]]
            == [without_timings(p) for p in compiled.stats["per_prompt"]])
    stats = compiled.stats["per_prompt"][0]
    assert stats["forwards"] == compiled.forwards[0] == 1 + sum(stats["iterations_per_block"])
    assert stats["tokens"] == len(expected)
    assert sum(k * h for k, h in enumerate(stats["accepted_per_iteration_histogram"])) + (
        stats["stop_reason"] in ("eos_correction", "eos_bonus", "eos_first")) == len(expected)


def test_several_prompts_one_call():
    params = random_params(3, 4.0)
    prompts = [[5], list(range(2, 15)), [63, 0, 7]]
    result = generate_jacobi(params, CFG, prompts, max_new_tokens=12, eos_ids=[], block_size=8, warmup=True)
    assert result.token_ids == [ar_tokens(params, p, 12) for p in prompts]
    total = result.stats["total"]
    assert total["forwards"] == sum(result.forwards) and total["tokens"] == 36
    assert result.seconds >= result.prefill_seconds > 0


def test_eos_in_accepted_prefix_correction_and_bonus():
    """With each output token of predictable models (``eos_cases``) as the EOS id, Jacobi must stop exactly
    where AR does; every place an EOS can appear (first token, accepted prefix, correction, bonus) must occur."""
    seen = set()
    for case, (params, prompts) in enumerate(eos_cases()):
        for prompt in prompts:
            free = ar_tokens(params, prompt, MAX_NEW)
            for eos in sorted(set(free)):
                expected = ar_tokens(params, prompt, MAX_NEW, [eos])
                assert expected == free[: free.index(eos) + 1]
                for block_size in BLOCK_SIZES:
                    for draft_seed in range(2):
                        result = _jacobi(params, prompt, MAX_NEW, [eos], block_size=block_size, seed=draft_seed)
                        assert result.token_ids[0] == expected, (case, prompt, eos, block_size)
                        seen.add(result.stats["per_prompt"][0]["stop_reason"])
    assert {"eos_accepted", "eos_correction", "eos_bonus", "eos_first"} <= seen, seen


def test_predictable_model_accepts_many_tokens_per_forward():
    # Every token leads to 9, and 9 to itself: after one Jacobi update every draft token is right.
    params = successor_params(cycle_map([9]))
    result = _jacobi(params, [1, 2, 3, 4], MAX_NEW, block_size=8)
    assert result.token_ids[0] == ar_tokens(params, [1, 2, 3, 4], MAX_NEW) == [9] * MAX_NEW
    stats = result.stats["per_prompt"][0]
    assert stats["max_accepted_per_iteration"] == 8
    assert stats["tpf"] >= 4.0
    # A 3-cycle: random context draws match by chance, and matches persist under the Jacobi update.
    params = successor_params(cycle_map([20, 21, 22]))
    result = _jacobi(params, [20, 21, 22, 5], MAX_NEW, block_size=8)
    assert result.token_ids[0] == ar_tokens(params, [20, 21, 22, 5], MAX_NEW)
    assert result.stats["per_prompt"][0]["max_accepted_per_iteration"] >= 2


@pytest.mark.parametrize("block_size", [3, 8])
def test_recorded_states_are_the_jacobi_iterates(block_size):
    params = random_params(11, 8.0)
    prompt = [4, 8, 15, 16, 23, 42]
    blocks = record_trajectories(params, CFG, prompt, block_size=block_size, max_new_tokens=14, seed=1)
    num_blocks = -(-14 // block_size)
    assert len(blocks) == num_blocks
    expected = ar_tokens(params, prompt, num_blocks * block_size)
    context = list(prompt)
    rng_drafts = 0
    for j, block in enumerate(blocks):
        assert block.prompt_ids.tolist() == context
        assert block.states.shape[1] == block_size and block.states.shape[0] >= 2
        assert block.fixed_point.tolist() == expected[j * block_size:(j + 1) * block_size]
        # state 0 is the random draft (block j > 0 starts with the known-correct bonus token) ...
        if j > 0:
            assert block.states[0][0] == block.fixed_point[0]
        rng_drafts += int(not np.array_equal(block.states[0], block.fixed_point))
        # ... and each later state is one cache-free Jacobi update of the one before.
        for before, after in zip(block.states[:-1], block.states[1:]):
            np.testing.assert_array_equal(after, jacobi_update(params, context, before))
        context += block.fixed_point.tolist()
    assert rng_drafts > 0


def test_recording_stops_after_the_eos_block():
    params = random_params(5, 8.0)
    free = ar_tokens(params, [1, 2], 16)
    eos = free[5]
    blocks = record_trajectories(params, CFG, [1, 2], block_size=3, max_new_tokens=15, eos_ids=[eos])
    stop_block = free.index(eos) // 3
    assert len(blocks) == stop_block + 1 < 5
    # Blocks run to their fixed point: the EOS block is complete, tokens past EOS included.
    assert np.concatenate([b.fixed_point for b in blocks]).tolist() == free[: 3 * (stop_block + 1)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=0), "block_size"), (dict(block_size=5000), "block_size"), (dict(block_size=2.0), "block_size"),
    (dict(driver="fast"), "driver"), (dict(on_tokens=print), "driver='python'"), (dict(seed=-1), "seed"),
    (dict(max_new_tokens=0), "max_new_tokens"),
])
def test_invalid_requests_raise(kwargs, message):
    args = dict(max_new_tokens=4, eos_ids=[], warmup=False) | kwargs
    with pytest.raises(GenerationError, match=message):
        generate_jacobi(random_params(0), CFG, [[1, 2]], **args)
