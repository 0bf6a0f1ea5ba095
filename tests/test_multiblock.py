"""Multi-block decoding with rejection recycling ("mr") is lossless, reduces to vanilla Jacobi with one block and
no pool, and on predictable models really recycles, spawns and promotes blocks that carry work over."""

import pytest
from hypothesis import given, settings, strategies as st

from tests.support.decoding_models import (CFG, MAX_NEW, MAX_PROMPT, VOCAB, ar_tokens, cycle_map, eos_cases,
                                           random_params, successor_params)
from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.stats import without_timings

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision

# (block_size, num_blocks, spawn_ratio, pool_size); each setting compiles its own program: keep the list short.
SETTINGS = ((8, 2, 0.85, 4), (3, 3, 0.34, 3), (8, 1, 0.85, 1))


def _mr(params, prompt, max_new, eos=(), setting=SETTINGS[0], seed=0, **kw):
    n, k, r, pool = setting
    return generate_mr(params, CFG, [list(prompt)], max_new_tokens=max_new, eos_ids=list(eos), block_size=n,
                       num_blocks=k, spawn_ratio=r, pool_size=pool, seed=seed, warmup=False, **kw)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 4.0, 10.0]),
       prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT),
       setting=st.sampled_from(SETTINGS), max_new=st.integers(1, MAX_NEW),
       eos=st.one_of(st.just(()), st.tuples(st.integers(0, VOCAB - 1))), draft_seed=st.integers(0, 3))
def test_mr_equals_ar(seed, scale, prompt, setting, max_new, eos, draft_seed):
    params = random_params(seed, scale)
    result = _mr(params, prompt, max_new, eos, setting, draft_seed)
    expected = ar_tokens(params, prompt, max_new, eos)
    assert result.token_ids[0] == expected
    # The python driver runs the same step: same tokens, streamed in order, and the same statistics; the
    # observer sees every forward after the prefill, and the tokens it sees emitted add up to the output.
    streamed, steps = [], []
    python = _mr(params, prompt, max_new, eos, setting, draft_seed, driver="python",
                 on_tokens=lambda i, ids: streamed.extend(ids), on_step=lambda i, before, after: steps.append(after))
    assert python.token_ids[0] == streamed == expected
    assert without_timings(python.stats["per_prompt"][0]) == without_timings(result.stats["per_prompt"][0])
    assert len(steps) == result.forwards[0] - 1 and (not steps or steps[-1].out[: len(expected)].tolist() == expected)
    stats = result.stats["per_prompt"][0]
    assert stats["forwards"] == result.forwards[0] == 1 + sum(stats["iterations_per_block"])
    assert stats["recycling_wins"] <= stats["recycling_rounds"] < stats["forwards"]
    assert stats["promotions_carried"] <= stats["promotions"] <= stats["spawns"]


@pytest.mark.parametrize("model_seed", [0, 1])
def test_one_block_without_pool_is_vanilla_jacobi(model_seed):
    """K=1, pool 1: the same step sequence as ``generate_jacobi`` (same RNG use), so identical statistics."""
    params = random_params(model_seed, 4.0)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    mr = _mr(params, prompt, MAX_NEW, setting=SETTINGS[2], seed=model_seed)
    jac = generate_jacobi(params, CFG, [prompt], max_new_tokens=MAX_NEW, eos_ids=[], block_size=8, seed=model_seed,
                          warmup=False)
    assert mr.token_ids == jac.token_ids == [ar_tokens(params, prompt, MAX_NEW)]
    for key in ("forwards", "iterations_per_block", "accepted_per_iteration_histogram"):
        assert mr.stats["per_prompt"][0][key] == jac.stats["per_prompt"][0][key]
    assert mr.stats["total"]["spawns"] == mr.stats["total"]["recycling_rounds"] == 0


def test_eos_everywhere():
    seen = set()
    for case, (params, prompts) in enumerate(eos_cases()):
        for prompt in prompts:
            free = ar_tokens(params, prompt, MAX_NEW)
            for eos in sorted(set(free)):
                expected = ar_tokens(params, prompt, MAX_NEW, [eos])
                for setting in SETTINGS[:2]:
                    for draft_seed in range(2):
                        result = _mr(params, prompt, MAX_NEW, [eos], setting, draft_seed)
                        assert result.token_ids[0] == expected, (case, prompt, eos, setting)
                        seen.add(result.stats["per_prompt"][0]["stop_reason"])
    assert {"eos_accepted", "eos_correction", "eos_bonus", "eos_first"} <= seen, seen


def test_promotion_carries_work_over():
    # Everything leads to 9: a spawned block converges while the RA finishes, and its work is kept on promotion.
    # Whether a block spawns depends on the random drafts: among a few draft seeds, some must carry work over.
    params = successor_params(cycle_map([9]))
    prompt = [1, 2, 3, 4]
    carried = 0
    for seed in range(4):
        result = _mr(params, prompt, MAX_NEW, setting=SETTINGS[1], seed=seed)
        assert result.token_ids[0] == ar_tokens(params, prompt, MAX_NEW)
        stats = result.stats["per_prompt"][0]
        assert stats["promotions"] <= stats["spawns"] and stats["promotions_carried"] <= stats["promotions"]
        assert stats["max_accepted_per_iteration"] == 3
        assert stats["tpf"] >= 2.0
        carried += stats["promotions_carried"] >= 1
    assert carried >= 1


def test_recycling_wins_on_periodic_text():
    # A 5-cycle: the committed text repeats, so pool entries that hold it predict the next tokens.
    params = successor_params(cycle_map([30, 31, 32, 33, 34]))
    prompt = [30, 31, 32, 33, 34, 30, 31, 2]
    result = _mr(params, prompt, MAX_NEW)
    assert result.token_ids[0] == ar_tokens(params, prompt, MAX_NEW)
    stats = result.stats["per_prompt"][0]
    assert stats["recycling_wins"] >= 1
    no_pool = _mr(params, prompt, MAX_NEW, setting=SETTINGS[2])
    assert no_pool.token_ids == result.token_ids
    assert stats["forwards"] < no_pool.stats["per_prompt"][0]["forwards"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=0), "block_size"), (dict(num_blocks=0), "num_blocks"), (dict(num_blocks=9), "num_blocks"),
    (dict(pool_size=0), "pool_size"), (dict(spawn_ratio=0.0), "spawn_ratio"), (dict(spawn_ratio=1.5), "spawn_ratio"),
    (dict(spawn_ratio="high"), "spawn_ratio"),
])
def test_invalid_requests_raise(kwargs, message):
    args = dict(max_new_tokens=4, eos_ids=[], warmup=False) | kwargs
    with pytest.raises(GenerationError, match=message):
        generate_mr(random_params(0), CFG, [[1, 2]], **args)
