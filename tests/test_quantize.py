"""int8 (W8A8) decoding: quantisation within half a step, the int8 matmul equals its dequantised float product, a
row's result never depends on the other rows, and int8 jacobi / mr tokens equal int8 AR tokens (batched too)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cpu_kernels import quantize_rows, unpack_int8
from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.model.decode_view import decode_view, stacked_params
from jf_jax.model.quantize import dequantize_weight, int8_matmul, quantize_weight
from tests.support.decoding_models import CFG, MAX_NEW, MAX_PROMPT, VOCAB, random_params


def test_weights_round_to_within_half_a_step_per_output_channel():
    w = jax.random.normal(jax.random.PRNGKey(0), (48, 3, 8)) * jnp.arange(1, 25).reshape(3, 8)
    q = quantize_weight(w)
    assert q.packed.data.dtype == jnp.int8 and q.packed.k == 48 and q.packed.n == 24
    err = np.abs(np.asarray(dequantize_weight(q)) - np.asarray(w)).reshape(48, 24)
    assert (err <= np.asarray(q.packed.scale[:24]) / 2 + 1e-6).all()
    values = np.abs(np.asarray(unpack_int8(q.packed), np.int32))
    assert (values.max(axis=0) == 127).all()  # every channel uses the whole range
    zero = quantize_weight(jnp.zeros((4, 2)))
    assert not np.asarray(dequantize_weight(zero)).any()


def test_matmul_is_the_product_of_the_dequantised_operands():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((5, 2, 3, 16)), jnp.float32)
    q = quantize_weight(jnp.asarray(rng.standard_normal((3, 16, 40)), jnp.float32), in_dims=2)
    got = np.asarray(int8_matmul(x, q))
    xq, sx = quantize_rows(x.reshape(10, 48))
    want = (np.asarray(xq, np.float64) * np.asarray(sx)[:, None]) @ np.asarray(dequantize_weight(q), np.float64
                                                                               ).reshape(48, 40)
    np.testing.assert_allclose(got.reshape(10, 40), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="trailing axes"):
        int8_matmul(x[..., :8], q)


def test_a_row_gets_the_same_bits_among_any_rows():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((33, 576)), jnp.bfloat16)
    q = quantize_weight(jnp.asarray(rng.standard_normal((576, 1536)) * 0.05, jnp.float32))
    full = np.asarray(jax.jit(int8_matmul)(x, q))
    for rows in (slice(0, 1), slice(0, 2), slice(0, 16), slice(5, 33)):
        np.testing.assert_array_equal(np.asarray(jax.jit(int8_matmul)(x[rows], q)), full[rows])


def test_int8_view_round_trips_to_its_dequantised_values():
    params = random_params(0)
    view = decode_view(params, int8=True)
    back = stacked_params(view, CFG)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=float(np.abs(np.asarray(a)).max()) / 200)
    with pytest.raises(ValueError, match="choose one of"):
        decode_view(params, pack=True, int8=True)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 4.0, 10.0]),
       prompts=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT), min_size=3,
                        max_size=3),
       max_new=st.integers(1, MAX_NEW), batch=st.sampled_from([1, 3]))
def test_int8_parallel_decoders_equal_int8_ar(seed, scale, prompts, max_new, batch):
    view = decode_view(random_params(seed, scale), int8=True)
    expected = generate_ar(view, CFG, prompts, max_new_tokens=max_new, eos_ids=[], batch_size=1,
                           warmup=False).token_ids
    jacobi = generate_jacobi(view, CFG, prompts, max_new_tokens=max_new, eos_ids=[], block_size=3, batch_size=batch,
                             warmup=False)
    mr = generate_mr(view, CFG, prompts, max_new_tokens=max_new, eos_ids=[], block_size=3, num_blocks=3,
                     spawn_ratio=0.34, pool_size=3, batch_size=batch, warmup=False)
    assert jacobi.token_ids == mr.token_ids == expected
