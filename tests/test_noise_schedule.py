"""Noise ratio, schedule levels and state selection (docs/method.md, section 3 and decision 3)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jf_jax.training.noise_schedule import (first_divergence, noise_ratio, schedule_levels, select_noisy_blocks,
                                            select_state, state_ratios, target_level, target_ratio)

FIXED = np.array([5, 6, 7, 8])


def test_first_divergence_and_ratio():
    assert first_divergence([5, 6, 7, 8], FIXED) == 4 and noise_ratio([5, 6, 7, 8], FIXED) == 0.0
    assert first_divergence([9, 6, 7, 8], FIXED) == 0 and noise_ratio([9, 6, 7, 8], FIXED) == 1.0
    # The ratio is the suffix from the FIRST mismatch, not the number of wrong tokens.
    assert first_divergence([5, 9, 7, 8], FIXED) == 1 and noise_ratio([5, 9, 7, 8], FIXED) == 0.75
    assert noise_ratio([5, 6, 9, 9], FIXED) == 0.5
    with pytest.raises(ValueError):
        first_divergence([1, 2, 3], FIXED)


def test_levels_exclude_one():
    np.testing.assert_array_equal(schedule_levels(4), [0.0, 0.25, 0.5, 0.75])
    np.testing.assert_array_equal(schedule_levels(1), [0.0])


def test_progressive_reverse_random_levels():
    assert [target_ratio(j, 4) for j in range(9)] == [0, .25, .5, .75, 0, .25, .5, .75, 0]
    assert [target_ratio(j, 4, "reverse") for j in range(5)] == [.75, .5, .25, 0, .75]
    rng = np.random.default_rng(0)
    draws = [target_level(j, 4, "random", rng) for j in range(400)]
    assert set(draws) == {0, 1, 2, 3}
    with pytest.raises(ValueError):
        target_level(0, 4, "random")  # needs an rng
    with pytest.raises(ValueError):
        target_level(0, 4, "cosine")


def test_select_closest_and_ties_go_to_earlier_state():
    states = np.array([[1, 1, 1, 1],   # ratio 1.0 (true random draft)
                       [5, 1, 1, 1],   # 0.75
                       [5, 6, 7, 1],   # 0.25
                       [5, 6, 7, 8]])  # 0.0 fixed point
    np.testing.assert_array_equal(state_ratios(states), [1.0, 0.75, 0.25, 0.0])
    assert select_state(states, 0, 4) == 3
    assert select_state(states, 3, 4) == 1
    assert select_state(states, 1, 4) == 2
    # target 0.5: 0.75 and 0.25 are equally close -> the earlier state (index 1).
    assert select_state(states, 2, 4) == 1
    # Ties must be exact even where float arithmetic would break them: n=3, target 1/2, ratios 2/3 and 1/3.
    states3 = np.array([[5, 1, 1], [5, 6, 1], [5, 6, 7]])  # ratios 2/3, 1/3, 0
    assert select_state(states3, 1, 2) == 0


def test_select_noisy_blocks_progressive():
    blocks = [np.array([[1, 1, 1, 1], [5, 1, 1, 1], [5, 6, 7, 8]])] * 4
    noisy, clean, chosen = select_noisy_blocks(blocks, window=4)
    # state ratios 1, .75, 0; levels 0 and .25 are closest to the fixed point, .5 and .75 to state 1.
    np.testing.assert_array_equal(chosen, [2, 2, 1, 1])
    np.testing.assert_array_equal(clean, np.tile([5, 6, 7, 8], (4, 1)))
    np.testing.assert_array_equal(noisy[3], [5, 1, 1, 1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_selection_is_argmin_with_first_tie(n, w, seed):
    rng = np.random.default_rng(seed)
    fixed = rng.integers(0, 5, n)
    states = [rng.integers(0, 5, n) for _ in range(rng.integers(0, 5))] + [fixed]
    states = np.stack(states)
    level = int(rng.integers(w))
    k = select_state(states, level, w)
    dist = [abs(r - level / w) for r in state_ratios(states)]
    assert dist[k] <= min(dist) + 1e-12
    assert all(d > dist[k] + 1e-12 for d in dist[:k])
