"""The row counts a decode forward gives XLA's dots (``weight_matmul.DotRows``): the policy per machine; that a row
of a decode matmul, and a query of the attention twin, get the same bits at every row count on this machine (for
weights with few outputs, whose rows XLA:CPU may chunk, and many); and that padding a short forward to more rows
changes neither its tokens' logits nor the cache past them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax.model import transformer
from jf_jax.model.cached_attention import cached_attention
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import decode_view
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import cast_params, init_params
from jf_jax.model.weight_matmul import DotRows, dot_rows, matmul, this_machine_dot_rows

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"})


def test_the_policy_pads_bf16_to_three_rows_only_on_cpus_with_amx():
    assert dot_rows("bfloat16", "cpu", AVX512 | {"amx_bf16", "amx_tile"}) == DotRows(3, 64)
    assert dot_rows("bfloat16", "cpu", AVX512) == DotRows(2, 64)
    assert dot_rows("bfloat16", "cpu", None) == DotRows(3, 64)  # unknown flags: as if AMX
    assert dot_rows("float32", "cpu", AVX512 | {"amx_bf16"}) == DotRows(2, 32)
    # Off the CPU fixed decode shapes keep rows invariant: no bf16 tiles (a tile is a sequential loop there).
    assert dot_rows("bfloat16", "gpu", None) == DotRows(2, None)
    assert dot_rows("float32", "tpu", None) == DotRows(2, 32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("outputs", [64, 128, 1536])
def test_a_row_of_a_decode_matmul_gets_the_same_bits_at_every_row_count(dtype, outputs):
    rows = this_machine_dot_rows(dtype)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 140, 576)), dtype)
    w = (jnp.asarray(rng.standard_normal((576, outputs)) * 0.05, dtype),)
    dot = functools.partial(decode_jit(lambda w, a: matmul("btd,dn->btn", a, w, dtype, rows.tile)), w)
    want = np.asarray(dot(x))[0]
    # Around the fewest rows, the tile and XLA's 64-row chunks (a chunk of one or two rows is computed apart).
    for m in sorted({rows.fewest, rows.fewest + 1, 16, 32, 33, 63, 64, 65, 66, 129, 130, 140}):
        got = np.asarray(dot(x[:, :m]))[0]
        np.testing.assert_array_equal(got, want[:m], err_msg=f"{m} rows")


@pytest.mark.parametrize("heads,kv_heads", [(9, 9), (9, 3), (14, 2)])
def test_the_attention_twin_gives_a_query_the_same_bits_at_every_block_length(heads, kv_heads):
    """bf16 queries of a block of T tokens, T * (heads per KV head) crossing 64 rows (the plain-JAX attention)."""
    rng = np.random.default_rng(0)
    dh, capacity, length = 64, 256, 70
    cache_k, cache_v = (jnp.asarray(rng.standard_normal((1, capacity, kv_heads, dh)), jnp.bfloat16) for _ in "kv")
    q = jnp.asarray(rng.standard_normal((1, 40, heads, dh)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((1, 40, kv_heads, dh)), jnp.bfloat16) for _ in "kv")
    attend = functools.partial(decode_jit(
        lambda t, q, k, v, cache_k, cache_v: cached_attention(q[:, :t], k[:, :t], v[:, :t], jnp.ones((1, t), bool),
                                                              cache_k, cache_v, jnp.asarray([length]),
                                                              use_kernel=False),
        static_argnums=0), q=q, k=k, v=v, cache_k=cache_k, cache_v=cache_v)
    want = np.asarray(attend(40).astype(jnp.float32))
    for t in (1, 2, 3, 5, 16, 21, 22, 23, 33):
        np.testing.assert_array_equal(np.asarray(attend(t).astype(jnp.float32)), want[:, :t], err_msg=f"{t} tokens")


SMALL = ModelConfig(architecture="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5,
                    max_position_embeddings=512, attention_bias=False, tie_word_embeddings=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_short_forward_padded_to_more_rows_keeps_its_tokens_bits_and_the_cache(dtype, monkeypatch):
    """Padding to five rows (more than any machine needs; rows >= 3 agree on every CPU measured): one and two tokens
    of one row, one token of two rows."""
    monkeypatch.setattr(transformer, "this_machine_dot_rows", lambda d: DotRows(5, this_machine_dot_rows(d).tile))
    cfg = SMALL.replace(dtype=dtype)
    params = decode_view(cast_params(init_params(cfg, jax.random.PRNGKey(0)), cfg.compute_dtype))
    rng = np.random.default_rng(1)
    P = 9
    prompt = rng.integers(0, cfg.vocab_size, (1, P)).astype(np.int32)
    cont = rng.integers(0, cfg.vocab_size, (1, 6)).astype(np.int32)

    @decode_jit
    def block_logits_of(params, tokens, cache):
        hidden, cache = transformer.forward(params, cfg, tokens, cache=cache)
        return transformer.logits(params, cfg, hidden), cache

    block_logits = functools.partial(block_logits_of, params)  # the weights as arguments, as in the decoders'

    _, cache0 = block_logits(prompt, KVCache.init(cfg, 1, 64))
    cache0 = cache0.commit(P)
    want, _ = block_logits(cont, cache0)
    for t in (1, 2):
        got, cache = block_logits(cont[:, :t], cache0)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0, :t]), err_msg=f"{t} tokens")
        assert not np.asarray(cache.k[:, :, P + t:]).any() and not np.asarray(cache.v[:, :, P + t:]).any()
    two = KVCache(k=jnp.concatenate([cache0.k] * 2, axis=1), v=jnp.concatenate([cache0.v] * 2, axis=1),
                  lengths=jnp.asarray([P, P], jnp.int32))
    got, cache = block_logits(np.concatenate([cont[:, :1]] * 2), two)
    np.testing.assert_array_equal(np.asarray(got[:, 0]), np.asarray(want[0, :1]).repeat(2, axis=0))
    assert not np.asarray(cache.k[:, :, P + 1:]).any()
