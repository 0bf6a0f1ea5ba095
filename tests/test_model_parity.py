"""The model against transformers' own Qwen2 / Llama code, and full forward == prefill + cached blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.hf_models import hf_logits, jax_twin, make_hf_model, torch
from jf_jax.weights.hf_names import params_from_hf, params_to_hf
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.transformer import forward_logits as _forward_logits
from jf_jax.model.config import from_hf_config
from jf_jax.model.rope import rope, rope_tables
from jf_jax.model.transformer import rms_norm
from jf_jax.model.decode_view import DecodeView, as_decode_view, decode_view, stacked_params
from jf_jax.model.params import cast_params

forward_logits = jax.jit(_forward_logits, static_argnums=1)  # op-by-op dispatch would dominate test time

CASES = [  # (arch, tied embeddings, kv heads): biases (qwen2), tied and untied, GQA and MHA
    ("qwen2", False, 2),
    ("qwen2", True, 1),
    ("llama", True, 2),
    ("llama", False, 4),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{'tied' if c[1] else 'untied'}-kv{c[2]}")
def twins(request):
    arch, tie, kv = request.param
    model = make_hf_model(arch, tie=tie, kv_heads=kv, seed=request.param_index)
    cfg, params = jax_twin(model)
    return model, cfg, params


def test_logits_match_transformers(twins):
    model, cfg, params = twins
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 37))
    ours, _ = forward_logits(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(ours), hf_logits(model, tokens), atol=2e-5, rtol=1e-5)


def test_unstacked_layers_give_the_same_logits(twins):
    _, cfg, params = twins
    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (1, 19))
    stacked, _ = forward_logits(params, cfg, tokens)
    for shards in (1, 3):  # 3 shards: uneven splits of every output axis
        view = decode_view(params, column_shards=shards)
        unstacked, _ = forward_logits(view, cfg, tokens)
        np.testing.assert_allclose(np.asarray(unstacked), np.asarray(stacked), atol=1e-5, rtol=1e-5)
        restacked = stacked_params(view, cfg)
        assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), restacked, params))


def test_decoders_take_a_view_as_it_is_and_convert_stacked_params():
    """``as_decode_view``: a loaded model's view passes through untouched (its shards, packing or int8 are kept);
    stacked training params become the default view (one unsplit shard per weight)."""
    cfg, params = jax_twin(make_hf_model("llama", tie=False, kv_heads=2, seed=0))
    view = decode_view(params, column_shards=2)
    assert as_decode_view(view) is view
    converted = as_decode_view(params)
    assert isinstance(converted, DecodeView) and converted.column_shards == 1
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), stacked_params(converted, cfg),
                                     params))


@pytest.mark.parametrize("splits", [(11, 1, 5, 12), (29,)])
def test_full_forward_equals_prefill_plus_cached_blocks(twins, splits):
    _, cfg, params = twins
    total = sum(splits)
    tokens = np.random.RandomState(2).randint(0, cfg.vocab_size, (2, total))
    full, _ = forward_logits(params, cfg, tokens)
    cache = KVCache.init(cfg, batch_size=2, capacity=64)
    pieces, start = [], 0
    for size in splits:
        block, cache = forward_logits(params, cfg, tokens[:, start:start + size], cache=cache)
        cache = cache.commit(size)
        pieces.append(np.asarray(block))
        start += size
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), np.asarray(full), atol=2e-5, rtol=1e-5)
    assert np.asarray(cache.lengths).tolist() == [total, total]


def test_rolled_back_block_leaves_no_trace(twins):
    """Writing a wrong block and not committing it must not change later results (Jacobi's rollback)."""
    _, cfg, params = twins
    tokens = np.random.RandomState(3).randint(0, cfg.vocab_size, (1, 12))
    cache = KVCache.init(cfg, batch_size=1, capacity=32)
    _, cache = forward_logits(params, cfg, tokens[:, :8], cache=cache)
    cache = cache.commit(8)
    garbage = (tokens[:, 8:] + 5) % cfg.vocab_size
    _, cache = forward_logits(params, cfg, np.concatenate([garbage, garbage], 1), cache=cache)  # written, not committed
    after, _ = forward_logits(params, cfg, tokens[:, 8:], cache=cache)
    full, _ = forward_logits(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(after), np.asarray(full)[:, 8:], atol=2e-5, rtol=1e-5)


def test_rows_with_different_lengths_are_independent(twins):
    _, cfg, params = twins
    rs = np.random.RandomState(4)
    a, b = rs.randint(0, cfg.vocab_size, 9), rs.randint(0, cfg.vocab_size, 5)
    cache = KVCache.init(cfg, batch_size=2, capacity=32).with_lengths([0, 0])
    padded = np.stack([a, np.concatenate([b, np.zeros(4, int)])])
    _, cache = forward_logits(params, cfg, padded, cache=cache)
    cache = cache.with_lengths([9, 5])
    nxt = rs.randint(0, cfg.vocab_size, (2, 3))
    got, _ = forward_logits(params, cfg, nxt, cache=cache)
    for row, prompt in enumerate((a, b)):
        ref, _ = forward_logits(params, cfg, np.concatenate([prompt, nxt[row]])[None])
        np.testing.assert_allclose(np.asarray(got[row]), np.asarray(ref[0, -3:]), atol=2e-5, rtol=1e-5)


def test_bfloat16_compute_stays_close(twins):
    model, cfg, params = twins
    tokens = np.random.RandomState(5).randint(0, cfg.vocab_size, (1, 16))
    ref = hf_logits(model, tokens)
    bf16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    ours, _ = forward_logits(cast_params(params, jnp.bfloat16), bf16, tokens)
    ours = np.asarray(ours)
    assert ours.dtype == np.float32
    # bf16 has ~3 significant digits; the argmax should rarely change on these well-separated logits.
    assert np.abs(ours - ref).max() < 0.15 * np.abs(ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() > 0.8


def test_hf_round_trip_is_exact(twins):
    model, cfg, params = twins
    back = params_to_hf(cfg, params)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name, value in back.items():
        np.testing.assert_array_equal(value, state[name], err_msg=name)
    again = params_from_hf(cfg, back)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), again, params))


def test_rms_norm_and_rope_match_transformers():
    from transformers.models.llama import modeling_llama as ml

    rs = np.random.RandomState(6)
    x = rs.randn(2, 5, 32).astype(np.float32)
    w = rs.rand(32).astype(np.float32) + 0.5
    norm = ml.LlamaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w))
        ref = norm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(rms_norm(jnp.asarray(x), w, 1e-6)), ref, atol=1e-6)

    q = rs.randn(2, 5, 3, 16).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 9, 100, 513, 2048]])
    inv = 1.0 / (1000.0 ** (np.arange(0, 16, 2, dtype=np.float32) / 16))
    angles = positions[..., None] * inv
    emb = np.concatenate([angles, angles], -1)
    cos, sin = np.cos(emb), np.sin(emb)
    ref_q = ml.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(cos),
                                    torch.from_numpy(sin), unsqueeze_dim=2)[0].numpy()
    cfg = from_hf_config(make_hf_model("llama", tie=False).config.to_dict()).replace(head_dim=16, rope_theta=1000.0)
    ours = rope(jnp.asarray(q), rope_tables(jnp.asarray(positions), cfg))
    np.testing.assert_allclose(np.asarray(ours), ref_q, atol=2e-5)


def test_unfused_rotary_tables_have_the_same_bits():
    """``rope_tables(unfused=True)`` (what the decode layout uses on CPU) is the same tables, not an approximation:
    the product with the identity that keeps XLA from fusing them into each layer is exact."""
    cfg = from_hf_config(make_hf_model("llama", tie=False).config.to_dict()).replace(head_dim=64)
    positions = jnp.arange(4096, dtype=jnp.int32).reshape(2, 2048)
    fused, unfused = (jax.jit(lambda p, u=u: rope_tables(p, cfg, unfused=u))(positions) for u in (False, True))
    for a, b in zip(fused, unfused):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
