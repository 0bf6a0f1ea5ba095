"""Compiled greedy AR decoding: equal to transformers' greedy generate, stops right, rejects bad input."""

import numpy as np
import pytest

from tests.support.hf_models import hf_greedy, jax_twin, make_hf_model
from jf_jax.decoding import ar as ar_decode
from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.common import GenerationError, bucket, prepare_prompts
from jf_jax.model.decode_view import decode_view

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def twins(request):
    model = make_hf_model(request.param, tie=request.param == "llama", seed=11, vocab=96)
    cfg, params = jax_twin(model)
    return model, cfg, decode_view(params)


def _prompts(cfg, lengths, seed):
    rs = np.random.RandomState(seed)
    return [rs.randint(0, cfg.vocab_size, n).tolist() for n in lengths]


def test_batch_of_different_lengths_equals_transformers_generate(twins):
    model, cfg, params = twins
    prompts = _prompts(cfg, (3, 17, 9), seed=0)
    eos = 7
    result = generate_ar(params, cfg, prompts, max_new_tokens=24, eos_ids=[eos])
    for prompt, tokens, forwards in zip(prompts, result.token_ids, result.forwards):
        assert tokens == hf_greedy(model, prompt, 24, eos)
        assert forwards == len(tokens)
    assert len({tuple(t) for t in result.token_ids}) > 1, "the test model should not be degenerate"
    assert result.seconds > result.prefill_seconds > 0


def test_stops_on_any_eos_and_includes_it(twins):
    _, cfg, params = twins
    prompt = _prompts(cfg, (6,), seed=1)
    free = generate_ar(params, cfg, prompt, max_new_tokens=20, eos_ids=[cfg.vocab_size - 1]).token_ids[0]
    stop_at = 4
    eos = free[stop_at]
    first = free.index(eos)  # the first occurrence is where generation must stop
    stopped = generate_ar(params, cfg, prompt, max_new_tokens=20, eos_ids=[cfg.vocab_size - 2, eos]).token_ids[0]
    assert stopped == free[: first + 1]


def test_max_new_tokens_is_exact_per_row(twins):
    _, cfg, params = twins
    prompts = _prompts(cfg, (4, 30), seed=2)
    for n in (1, 2, 13):
        result = generate_ar(params, cfg, prompts, max_new_tokens=n, eos_ids=[-1 % cfg.vocab_size])
        assert all(len(t) <= n for t in result.token_ids)
        assert any(len(t) == n for t in result.token_ids)


def test_prompts_in_one_bucket_reuse_the_compiled_programs(twins):
    _, cfg, params = twins
    generate_ar(params, cfg, _prompts(cfg, (20,), seed=3), max_new_tokens=5, eos_ids=[0])
    programs = (ar_decode.ARDecoder.init.program(), ar_decode.ARDecoder.run_compiled.program())
    compiled = tuple(p._cache_size() for p in programs)
    for n, new in ((17, 5), (31, 9), (25, 16)):  # same prompt bucket (32) and output bucket (16)
        generate_ar(params, cfg, _prompts(cfg, (n,), seed=n), max_new_tokens=new, eos_ids=[0])
    assert tuple(p._cache_size() for p in programs) == compiled
    assert bucket(17) == bucket(31) == 32 and bucket(5) == bucket(16) == 16


@pytest.mark.parametrize("prompts, max_new, message", [
    ([[1, 2, 3]], 0, "max_new_tokens must be a positive integer"),
    ([[1, 2, 3]], -4, "max_new_tokens must be a positive integer"),
    ([[]], 4, "prompt 0 is empty"),
    ([[1, 2], [5, 10_000]], 4, "prompt 1 has token ids outside the vocabulary"),
    ([list(range(1, 90)) * 6], 4, r"exceeds the model context of 512 tokens"),
    ([[1] * 500], 13, r"prompt of 500 tokens plus max_new_tokens=13 exceeds"),
    ([], 4, "no prompts"),
])
def test_bad_requests_are_named(twins, prompts, max_new, message):
    _, cfg, _ = twins
    with pytest.raises(GenerationError, match=message):
        prepare_prompts(cfg, prompts, max_new)
