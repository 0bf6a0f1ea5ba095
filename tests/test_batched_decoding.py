"""Batch > 1: one compiled program decodes several prompts, each row with its own block, acceptance, cache length
and stop, and a row's tokens and statistics are exactly those of decoding its prompt alone (and so AR's)."""

import pytest
from hypothesis import given, settings, strategies as st

from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.stats import without_timings
from tests.support.decoding_models import CFG, MAX_NEW, MAX_PROMPT, VOCAB, ar_tokens, random_params

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision

BATCH = 3  # 3 or 4 prompts: one full batch, or a full one and a padded one, on one compiled program
METHODS = {
    "jacobi": lambda params, prompts, **kw: generate_jacobi(params, CFG, prompts, block_size=3, **kw),
    "mr": lambda params, prompts, **kw: generate_mr(params, CFG, prompts, block_size=3, num_blocks=3, spawn_ratio=0.34,
                                                    pool_size=3, **kw),
}


def _decode(method, params, prompts, max_new, eos, **kw):
    return METHODS[method](params, prompts, max_new_tokens=max_new, eos_ids=list(eos), warmup=False, **kw)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(method=st.sampled_from(sorted(METHODS)), seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 4.0, 10.0]),
       prompts=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT), min_size=3,
                        max_size=4),
       max_new=st.integers(1, MAX_NEW), eos=st.one_of(st.just(()), st.tuples(st.integers(0, VOCAB - 1))),
       draft_seed=st.integers(0, 3))
def test_a_batch_decodes_each_prompt_as_alone(method, seed, scale, prompts, max_new, eos, draft_seed):
    params = random_params(seed, scale)
    batched = _decode(method, params, prompts, max_new, eos, batch_size=BATCH, seed=draft_seed)
    alone = _decode(method, params, prompts, max_new, eos, batch_size=1, seed=draft_seed)
    assert batched.token_ids == alone.token_ids == [ar_tokens(params, p, max_new, eos) for p in prompts]
    # Same per-row arithmetic, same per-prompt RNG: every statistic but the wall clock agrees.
    assert ([without_timings(p) for p in batched.stats["per_prompt"]]
            == [without_timings(p) for p in alone.stats["per_prompt"]])
    assert batched.stats["batch_size"] == BATCH and batched.stats["total"]["tokens"] == sum(map(len, alone.token_ids))
    assert "seconds" not in batched.stats["per_prompt"][0] and batched.seconds > 0


@pytest.mark.parametrize("method", sorted(METHODS))
def test_python_driver_streams_and_observes_every_row(method):
    params = random_params(7, 4.0)
    prompts = [[5], list(range(2, 15)), [63, 0, 7], [1, 2, 3, 4]]
    streamed, observed = {}, {}
    result = _decode(method, params, prompts, MAX_NEW, (), batch_size=BATCH, driver="python",
                     on_tokens=lambda i, ids: streamed.setdefault(i, []).extend(ids),
                     on_step=lambda i, before, after: observed.setdefault(i, []).append(after))
    compiled = _decode(method, params, prompts, MAX_NEW, (), batch_size=BATCH)
    assert result.token_ids == compiled.token_ids == [streamed[i] for i in range(len(prompts))]
    for i, tokens in enumerate(result.token_ids):  # one observation per forward of that prompt after its prefill
        assert len(observed[i]) == result.forwards[i] - 1
        assert observed[i][-1].out[: len(tokens)].tolist() == tokens and observed[i][-1].cache is None


def test_an_observer_can_stop_one_row():
    params = random_params(2, 4.0)
    prompts = [[5, 6], [9, 9, 1]]
    full = _decode("jacobi", params, prompts, MAX_NEW, (), batch_size=2)
    stopped = _decode("jacobi", params, prompts, MAX_NEW, (), batch_size=2, driver="python",
                      on_step=lambda i, before, after: i == 0)
    assert stopped.forwards[0] == 2 and stopped.token_ids[0] == full.token_ids[0][: len(stopped.token_ids[0])]
    assert stopped.token_ids[1] == full.token_ids[1]


def test_ar_batches_agree_with_one_batch():
    params = random_params(4, 10.0)
    prompts = [[5], list(range(2, 15)), [63, 0, 7]]
    together = generate_ar(params, CFG, prompts, max_new_tokens=MAX_NEW, eos_ids=[], batch_size=len(prompts),
                           warmup=False)
    pairs = generate_ar(params, CFG, prompts, max_new_tokens=MAX_NEW, eos_ids=[], batch_size=2, warmup=False)
    alone = generate_ar(params, CFG, prompts, max_new_tokens=MAX_NEW, eos_ids=[], batch_size=1, warmup=False)
    assert together.token_ids == pairs.token_ids == alone.token_ids
    assert "seconds" in alone.stats["per_prompt"][2] and "seconds" not in pairs.stats["per_prompt"][2]


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True, 10_000])
def test_bad_batch_sizes_are_refused(batch_size):
    params = random_params(0)
    with pytest.raises(GenerationError, match="batch_size must be an integer"):
        generate_ar(params, CFG, [[1, 2]], max_new_tokens=4, eos_ids=[], batch_size=batch_size)
    with pytest.raises(GenerationError, match="batch_size must be an integer"):
        _decode("jacobi", params, [[1, 2]], 4, (), batch_size=batch_size)
