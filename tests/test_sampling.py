"""Sampling with the greedy guarantee: jacobi and mr sample exactly AR's tokens for the same seed, AR samples from
the model's filtered distribution, and the filters match a numpy reference (ties included)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats as scipy_stats

import jax
import jax.numpy as jnp

from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.sampling import GREEDY, NUCLEUS_CANDIDATES, Sampling, choose, filter_logits, sampling_key
from jf_jax.model.transformer import forward_logits
from tests.support.decoding_models import CFG, MAX_NEW, MAX_PROMPT, VOCAB, random_params

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision

SAMPLERS = [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=6), Sampling(temperature=1.5, top_p=0.8)]
METHODS = {  # two block shapes per method; each (method, sampler) pair compiles once
    "jacobi": lambda params, prompts, **kw: generate_jacobi(params, CFG, prompts, block_size=3, **kw),
    "mr": lambda params, prompts, **kw: generate_mr(params, CFG, prompts, block_size=3, num_blocks=3,
                                                    spawn_ratio=0.34, pool_size=3, **kw),
}


def _ar(params, prompts, max_new, eos, sampling, seed, **kw):
    return generate_ar(params, CFG, prompts, max_new_tokens=max_new, eos_ids=list(eos), warmup=False,
                       sampling=sampling, seed=seed, **kw).token_ids


@settings(max_examples=6, deadline=None, derandomize=True)
@given(method=st.sampled_from(sorted(METHODS)), sampler=st.sampled_from(range(len(SAMPLERS))),
       model_seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 4.0]),
       prompts=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT), min_size=1,
                        max_size=4),
       max_new=st.integers(1, MAX_NEW), eos=st.one_of(st.just(()), st.tuples(st.integers(0, VOCAB - 1))),
       seed=st.integers(0, 2**31 - 1), batch=st.sampled_from([1, 3]))
def test_jacobi_and_mr_sample_exactly_ars_tokens(method, sampler, model_seed, scale, prompts, max_new, eos, seed,
                                                 batch):
    params, sampling = random_params(model_seed, scale), SAMPLERS[sampler]
    got = METHODS[method](params, prompts, max_new_tokens=max_new, eos_ids=list(eos), warmup=False,
                          sampling=sampling, seed=seed, batch_size=batch)
    assert got.token_ids == _ar(params, prompts, max_new, eos, sampling, seed)
    assert got.stats["temperature"] == sampling.temperature and got.stats["seed"] == seed


def test_samples_depend_on_seed_and_prompt_index_only():
    params = random_params(3, 1.0)
    prompts = [[5, 9], [5, 9], [7]]
    sampling = SAMPLERS[0]
    together = _ar(params, prompts, MAX_NEW, (), sampling, seed=11)
    assert together[0] != together[1]  # same prompt, another index: another sample
    # a prompt's sample is keyed by its index in the request, not by its batch or the call it rides in
    assert _ar(params, prompts[1:2], MAX_NEW, (), sampling, seed=11, first_index=1)[0] == together[1]
    assert _ar(params, prompts, MAX_NEW, (), sampling, seed=11, batch_size=2) == together
    assert _ar(params, prompts, MAX_NEW, (), sampling, seed=12) != together
    greedy = _ar(params, prompts, MAX_NEW, (), GREEDY, seed=11)
    assert greedy[0] == greedy[1] and greedy != together
    python = generate_jacobi(params, CFG, prompts, max_new_tokens=MAX_NEW, eos_ids=[], block_size=3, warmup=False,
                             sampling=sampling, seed=11, driver="python", batch_size=3)
    assert python.token_ids == together  # the step-by-step driver too


def _mass_above(scaled: np.ndarray) -> np.ndarray:
    """Per token, the probability (float64) of the tokens strictly more likely than it."""
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return np.array([probs[scaled > v].sum() for v in scaled])


def _reference_filter(scaled: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The module's definition, per row, in float64 numpy: keep by value, ties at either boundary kept."""
    out = scaled.astype(np.float64).copy()
    if 0 < top_k < out.size:
        kth = np.sort(out)[::-1][top_k - 1]
        out[out < kth] = -np.inf
    if top_p < 1:
        out[~(_mass_above(out) < top_p)] = -np.inf
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=st.lists(st.integers(-6, 6), min_size=2, max_size=24), top_k=st.integers(0, 30),
       top_p=st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.3, 0.05]), scale=st.sampled_from([0.25, 1.0, 2.5]))
def test_filters_match_a_numpy_reference_with_ties(values, top_k, top_p, scale):
    scaled = np.asarray(values, np.float32) * np.float32(scale)  # small integers: many ties
    ours = np.asarray(filter_logits(jnp.asarray(scaled)[None], top_k, top_p))[0]
    ref = _reference_filter(scaled, top_k, top_p)
    after_top_k = _reference_filter(scaled, top_k, 1.0)
    # float32 sums may land on the other side of top_p than float64 only when a token's mass above is this close
    borderline = top_p < 1 and np.any(np.abs(_mass_above(after_top_k) - top_p) < 1e-5)
    assert np.array_equal(np.isfinite(ours), np.isfinite(ref)) or borderline
    assert np.array_equal(ours[np.isfinite(ours)], scaled[np.isfinite(ours)])  # kept logits are untouched


def test_nucleus_search_agrees_with_the_full_vocabulary_fallback_and_ignores_batch_mates():
    """Rows whose nucleus fits among the ``NUCLEUS_CANDIDATES`` most likely tokens take the cheap path, a flat row
    forces the bisection fallback on its whole batch: each row's filter is the same either way, and matches the
    numpy reference."""
    V = 3 * NUCLEUS_CANDIDATES
    rng = np.random.default_rng(0)
    spreads = [8.0, 3.0, 0.05, 1.0]  # peaked rows (small nucleus) ... a nearly flat row (nucleus > candidates)
    rows = np.stack([rng.normal(size=V) * s for s in spreads]).astype(np.float32)
    rows[1, :40] = rows[1, 0]  # a tie group near the top
    for top_p in (0.5, 0.9, 0.99):
        together = np.asarray(filter_logits(jnp.asarray(rows), 0, top_p))
        kept = np.isfinite(together).sum(-1)
        assert kept[2] > NUCLEUS_CANDIDATES and kept[0] < NUCLEUS_CANDIDATES  # both paths are exercised
        for r in range(len(rows)):
            alone = np.asarray(filter_logits(jnp.asarray(rows[r:r + 1]), 0, top_p))[0]
            assert np.array_equal(alone, together[r])
            ref = _reference_filter(rows[r], 0, top_p)
            assert np.array_equal(np.isfinite(ref), np.isfinite(alone)) or np.any(
                np.abs(_mass_above(rows[r]) - top_p) < 1e-5)


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.6, top_k=10),
                                      Sampling(temperature=1.2, top_p=0.7)], ids=["t1", "t0.6-k10", "t1.2-p0.7"])
def test_ar_samples_follow_the_models_distribution(sampling):
    """2,000 copies of one prompt, each its own request index (so its own noise), one token each: the counts
    against the model's filtered softmax, by a chi-square test at significance 0.001. The seed set is fixed, so
    the test is deterministic; another seed (or model) gives another, equally valid, draw."""
    params = random_params(5, 1.0)
    prompt = [3, 17, 42]
    draws = 2000
    first = [t[0] for t in _ar(params, [prompt] * draws, 1, (), sampling, seed=2024)]
    logits, _ = forward_logits(params, CFG, jnp.asarray([prompt]))
    scaled = np.asarray(logits[0, -1], np.float64) / sampling.temperature
    filtered = _reference_filter(scaled.astype(np.float32), sampling.top_k, sampling.top_p)
    probs = np.exp(filtered - filtered.max())
    probs /= probs.sum()
    counts = np.bincount(first, minlength=VOCAB)
    assert counts[probs == 0].sum() == 0  # filtered tokens are never drawn
    expected = probs * draws
    big = expected >= 5  # chi-square needs >= 5 expected per cell: pool the rare tokens into one cell
    obs = np.append(counts[big], counts[~big & (probs > 0)].sum())
    exp = np.append(expected[big], expected[~big & (probs > 0)].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    p_value = scipy_stats.chisquare(obs, exp).pvalue
    assert big.sum() >= 3 and p_value > 1e-3, (p_value, obs, exp)


def test_gumbel_noise_is_keyed_by_position_not_by_call_shape():
    """The same (key, position) gives the same choice whether it is chosen alone or among other positions."""
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 5, VOCAB)) * 3
    keys = jnp.stack([sampling_key(7, 0), sampling_key(7, 1)])
    positions = jnp.asarray([[10, 11, 12, 13, 14], [3, 4, 5, 6, 7]])
    together = choose(SAMPLERS[0], logits, positions, keys)
    for b in range(2):
        for t in range(5):
            alone = choose(SAMPLERS[0], logits[b:b + 1, t], positions[b:b + 1, t], keys[b:b + 1])
            assert int(alone[0]) == int(together[b, t])


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.5), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=1.0, top_k=-1), "top_k"), (dict(temperature=1.0, top_p=0.0), "top_p"),
    (dict(temperature=1.0, top_p=1.5), "top_p"), (dict(top_k=5), "only apply when sampling"),
    (dict(top_p=0.9), "only apply when sampling")])
def test_bad_sampling_settings_are_refused(kwargs, match):
    with pytest.raises(GenerationError, match=match):
        Sampling(**kwargs)
