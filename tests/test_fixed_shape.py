"""Fixed-shape decoding (``decoding.shapes``): every decode forward of a run has one shape, whatever the method,
so a backend that picks its kernels by shape (GPUs, TPUs) computes every token alike; the outputs stay AR's.

On the CPU these tests check what can be checked without a GPU: the padded decoders still give AR's tokens
(greedy and sampled), every forward of AR, Jacobi and multi-block runs traces to the same two shapes (the
prefill and the step), and whole-cache attention gives a query the same bits whether its keys were committed by
earlier forwards or come from its own block."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.decoding_models import CFG, random_params
from tests.support.traces import record_stack_traces
from jf_jax.cli import decode as decode_cli
from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.sampling import Sampling
from jf_jax.api import run_shape
from jf_jax.decoding.shapes import DecodeShape, default_decode_shape, natural_shape
from jf_jax.model.cached_attention import cached_attention, whole_cache_attention

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision

SHAPE = DecodeShape(4, 16)
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 8]]


def _runs(params, cfg, shape, sampling=Sampling(), max_new=16):
    kw = dict(max_new_tokens=max_new, eos_ids=[], warmup=False, batch_size=2, sampling=sampling, decode_shape=shape)
    return dict(ar=generate_ar(params, cfg, PROMPTS, **kw).token_ids,
                jacobi=generate_jacobi(params, cfg, PROMPTS, block_size=8, **kw).token_ids,
                mr=generate_mr(params, cfg, PROMPTS, block_size=8, num_blocks=2, pool_size=4, **kw).token_ids)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_padded_decoders_give_ars_tokens(dtype):
    cfg = dataclasses.replace(CFG, dtype=dtype)
    for seed in (0, 1):
        params = random_params(seed, 4.0)
        natural_ar = generate_ar(params, cfg, PROMPTS, max_new_tokens=16, eos_ids=[], warmup=False,
                                 batch_size=2).token_ids
        assert _runs(params, cfg, SHAPE) == dict(ar=natural_ar, jacobi=natural_ar, mr=natural_ar)


def test_padded_decoders_sample_ars_tokens():
    params = random_params(2, 4.0)
    sampling = Sampling(temperature=0.8, top_k=20)
    runs = _runs(params, CFG, SHAPE, sampling)
    assert runs["jacobi"] == runs["mr"] == runs["ar"]
    natural = generate_ar(params, CFG, PROMPTS, max_new_tokens=16, eos_ids=[], warmup=False, batch_size=2,
                          sampling=sampling).token_ids
    assert runs["ar"] == natural


def test_every_forward_of_a_run_has_one_shape(monkeypatch):
    """The model's stack is traced once per program: record the token shape and the cache capacity of each
    trace. Padded, AR, Jacobi and multi-block runs trace one prefill shape and one step shape between them;
    unpadded, they trace several (so the check can fail)."""
    traced = record_stack_traces(monkeypatch)
    cfg = dataclasses.replace(CFG, num_layers=1)  # a config no other test compiles: every program is traced here
    params = transformer_params(cfg)
    _runs(params, cfg, SHAPE, max_new=8)
    padded = set(traced)
    prompt_bucket = 16
    capacity = 64  # prompt bucket 16 + output bucket 16 + the width 16, rounded up to a whole 64-slot attention chunk
    assert padded == {((2, prompt_bucket + SHAPE.width), capacity, True),
                      ((2 * SHAPE.rows, SHAPE.width), capacity, True)}
    traced.clear()
    _runs(params, cfg, None, max_new=8)
    assert len({shape for shape, _, _ in traced}) > 2


def transformer_params(cfg):
    from jf_jax.model.params import init_params

    return init_params(cfg, jax.random.PRNGKey(0))


def test_whole_cache_attention_matches_cached_attention():
    rng = np.random.default_rng(0)
    B, T, H, K, Dh, S = 4, 8, 4, 2, 16, 128
    q, k_new, v_new = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in
                       ((B, T, H, Dh), (B, T, K, Dh), (B, T, K, Dh)))
    valid = jnp.asarray(np.arange(T)[None, :] < np.array([8, 5, 1, 3])[:, None])
    for Bc in (1, 2, 4):  # one cache row shared by all, groups of two rows, one each
        cache_k, cache_v = (jnp.asarray(rng.normal(size=(Bc, S, K, Dh)), jnp.float32) for _ in range(2))
        lengths = jnp.asarray(rng.integers(0, S - T, size=Bc), jnp.int32)
        ref = cached_attention(q, k_new, v_new, valid, cache_k, cache_v, lengths, use_kernel=False)
        got = whole_cache_attention(q, k_new, v_new, valid, cache_k, cache_v, lengths)
        mask = np.asarray(valid)[:, :, None, None]  # padding queries are unspecified
        np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, ref, 0), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_whole_cache_attention_gives_a_query_the_same_bits_wherever_its_keys_come_from(dtype):
    """Query at position p: as column c of a block over a cache of length p - c, and as column 0 of a one-token
    block (padded to the same T) over a cache holding the block's first c keys: identical bits."""
    rng = np.random.default_rng(1)
    T, H, K, Dh, S, L = 8, 4, 2, 16, 64, 20
    q = jnp.asarray(rng.normal(size=(1, T, H, Dh)), dtype)
    k_new, v_new = (jnp.asarray(rng.normal(size=(1, T, K, Dh)), dtype) for _ in range(2))
    cache_k, cache_v = (jnp.asarray(rng.normal(size=(1, S, K, Dh)), dtype) for _ in range(2))
    attend = jax.jit(whole_cache_attention)
    block = attend(q, k_new, v_new, jnp.ones((1, T), bool), cache_k, cache_v, jnp.asarray([L]))
    for c in range(T):
        committed_k = cache_k.at[:, L:L + c].set(k_new[:, :c])
        committed_v = cache_v.at[:, L:L + c].set(v_new[:, :c])
        one = lambda x: jnp.zeros_like(x).at[:, 0].set(x[:, c])  # noqa: E731
        step = attend(one(q), one(k_new), one(v_new), jnp.arange(T)[None] < 1, committed_k, committed_v,
                      jnp.asarray([L + c]))
        assert np.array_equal(np.asarray(step[0, 0]), np.asarray(block[0, c])), c


def test_shape_choice_and_errors():
    shapes = [natural_shape("ar"), natural_shape("jacobi", 16), natural_shape("mr", 16, 2, 4)]
    assert default_decode_shape(shapes, "gpu") == default_decode_shape(shapes, "tpu") == DecodeShape(4, 32)
    assert default_decode_shape(shapes, "cpu") is None
    runs = [("ar", {}), ("jacobi", dict(block_size=16)), ("mr", dict(block_size=16))]  # mr: K=2, pool 4 by default
    assert run_shape("auto", runs, backend="cuda") == DecodeShape(4, 32)
    assert run_shape("off", runs, backend="cuda") is None
    assert run_shape("8x64", runs) == DecodeShape(8, 64)
    with pytest.raises(GenerationError, match="mr forwards 4 row"):
        run_shape("2x64", runs)
    with pytest.raises(GenerationError, match="ROWSxWIDTH"):
        run_shape("wide", runs)
    with pytest.raises(GenerationError, match="jacobi forwards 1 row.*16 tokens"):
        generate_jacobi(random_params(0), CFG, PROMPTS, max_new_tokens=4, eos_ids=[], block_size=16,
                        decode_shape=DecodeShape(1, 8))


def test_cli_refuses_a_shape_that_does_not_cover_its_methods(capsys):
    code = decode_cli.main(["--prompt", "hi", "--methods", "ar,jacobi", "--block-size", "16", "--decode-shape",
                            "1x8"])
    err = capsys.readouterr().err
    assert code != 0 and "--decode-shape" in err and "jacobi forwards 1 row(s) of 16 tokens" in err
    assert "Traceback" not in err


def test_padded_steps_lower_for_tpu_with_the_same_dots():
    """Lowered for a TPU (``jax.export``, on this CPU), the padded AR, Jacobi and multi-block steps contain the same
    matrix products, operand shapes and all: one kernel choice per product serves every method."""
    import re

    from jax import export

    from jf_jax.decoding.ar import ARDecoder
    from jf_jax.decoding.common import eos_array, prepare_prompts, prompt_key
    from jf_jax.decoding.jacobi import JacobiDecoder
    from jf_jax.decoding.multiblock import MRDecoder
    from jf_jax.model.decode_view import decode_view

    cfg = dataclasses.replace(CFG, dtype="bfloat16")
    params = decode_view(random_params(0))
    prep = prepare_prompts(cfg, [[1, 2, 3]], 16, lookahead=SHAPE.width)
    rows = (jnp.asarray(prep.tokens), jnp.asarray(prep.lengths), prompt_key(0, 0)[None], prompt_key(1, 0)[None],
            jnp.int32(16), jnp.asarray(eos_array([2])))
    dots = {}
    for decoder in (ARDecoder(cfg, 1, shape=SHAPE), JacobiDecoder(cfg, 8, shape=SHAPE),
                    MRDecoder(cfg, 8, 2, 7, 4, shape=SHAPE)):
        state = decoder.init(params, *rows, prep.out_capacity, prep.cache_capacity)
        step = export.export(jax.jit(decoder._step), platforms=["tpu"])(params, state).mlir_module()
        dots[type(decoder).__name__] = sorted(set(re.findall(r"stablehlo.dot_general[^\n]*?: \((.*?)\) ->", step)))
    assert len(dots["ARDecoder"]) >= 6  # projections, attention scores and values, MLP, head: the forward is there
    assert dots["ARDecoder"] == dots["JacobiDecoder"] == dots["MRDecoder"]
