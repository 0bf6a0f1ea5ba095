"""Qwen3 and Llama 3.x (and the other RoPE scalings) against transformers' own models: logits, prefill + cached
blocks, lossless jacobi / mr, GGUF and export; the real 8B configs' parameter counts; refusals that name the option."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax import weights
from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.model.config import ConfigError, from_hf_config
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import abstract_params, count_params
from jf_jax.model.transformer import forward, forward_logits as _forward_logits, logits
from jf_jax.weights.hf_export import export_hf
from tests.support.hf_models import hf_logits, jax_twin, make_hf_model, torch, transformers

forward_logits = jax.jit(_forward_logits, static_argnums=1)

LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)
CASES = {  # name: (arch, tied, extra config); contexts of 512 with prompts up to 300 tokens
    "qwen3-tied-hd24": ("qwen3", True, dict(head_dim=24)),
    "qwen3-untied-kv1": ("qwen3", False, dict(head_dim=16, num_key_value_heads=1)),
    "llama3.1-rope": ("llama", False, dict(rope_scaling=LLAMA3)),
    "llama-linear": ("llama", True, dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "llama-dynamic": ("llama", False, dict(rope_scaling=dict(rope_type="dynamic", factor=2.0))),
    "llama-yarn": ("llama", False, dict(rope_scaling=dict(rope_type="yarn", factor=4.0,
                                                          original_max_position_embeddings=128))),
}


def _model(name, seed=0):
    arch, tie, extra = CASES[name]
    extra = dict(extra)
    kv = extra.pop("num_key_value_heads", 2)
    return make_hf_model(arch, tie=tie, kv_heads=kv, seed=seed, **extra)


@pytest.fixture(scope="module", params=sorted(CASES))
def twins(request):
    model = _model(request.param, seed=3)
    cfg, params = jax_twin(model)
    return request.param, model, cfg, params


def test_logits_match_transformers(twins):
    name, model, cfg, params = twins
    kind = CASES[name][2].get("rope_scaling", {}).get("rope_type")
    assert (cfg.rope_scaling.rope_type if cfg.rope_scaling else None) == kind
    assert cfg.qk_norm == (cfg.architecture == "qwen3")
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 300))  # past llama3 / yarn's original 64/128
    ours, _ = forward_logits(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(ours), hf_logits(model, tokens), atol=5e-5, rtol=1e-5)


def test_full_forward_equals_prefill_plus_cached_blocks(twins):
    _, _, cfg, params = twins
    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (1, 40))
    full, _ = forward_logits(params, cfg, tokens)
    cache = KVCache.init(cfg, batch_size=1, capacity=64)
    pieces, start = [], 0
    for size in (17, 1, 6, 16):
        chunk = jnp.asarray(tokens[:, start:start + size])
        hidden, cache = forward(params, cfg, chunk, cache=cache)
        cache = cache.commit(jnp.full((1,), size, jnp.int32))
        pieces.append(logits(params, cfg, hidden))
        start += size
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), np.asarray(full), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["qwen3-tied-hd24", "llama3.1-rope"])
def test_jacobi_and_mr_equal_ar(name):
    cfg, params = jax_twin(_model(name, seed=4))
    prompts = [[5, 9, 3], list(range(10, 40)), [77]]
    kw = dict(max_new_tokens=24, eos_ids=[], warmup=False)
    ar = generate_ar(params, cfg, prompts, **kw).token_ids
    assert generate_jacobi(params, cfg, prompts, block_size=4, batch_size=3, **kw).token_ids == ar
    assert generate_mr(params, cfg, prompts, block_size=4, num_blocks=2, pool_size=3, **kw).token_ids == ar


def test_qwen3_gguf_and_export_round_trip(tmp_path, tiny_gguf):
    from tests.support.gguf_models import tiny_model, write_gguf

    model = tiny_model("qwen3", tie=False, seed=6)
    loaded = weights.load(write_gguf(tmp_path / "q3.gguf", model, arch="qwen3"), cache=False)
    assert loaded.cfg.architecture == "qwen3" and loaded.cfg.head_dim == 24 and "q_norm" in loaded.params["layers"]
    tokens = np.random.RandomState(2).randint(0, loaded.cfg.vocab_size, (1, 20))
    ours, _ = forward_logits(loaded.params, loaded.cfg, tokens)
    np.testing.assert_allclose(np.asarray(ours), hf_logits(model, tokens), atol=2e-5, rtol=1e-5)
    # exported (with llama3 rope scaling on a llama twin too), transformers reads back the same model
    for cfg, params in (jax_twin(model), jax_twin(_model("llama3.1-rope", seed=7))):
        out = export_hf(cfg, params, loaded.tokenizer, tmp_path / f"export-{cfg.architecture}")
        back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        ours, _ = forward_logits(params, cfg, tokens)
        np.testing.assert_allclose(hf_logits(back, tokens), np.asarray(ours), atol=2e-5, rtol=1e-5)
        assert weights.load(out, cache=False).cfg == cfg


QWEN3_8B = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=40960, rope_theta=1000000, rms_norm_eps=1e-6,
                tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, sliding_window=None,
                hidden_act="silu")
LLAMA31_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096,
                  intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  attention_bias=False, mlp_bias=False, hidden_act="silu",
                  rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192, rope_type="llama3"))


@pytest.mark.parametrize("hf,count", [(QWEN3_8B, 8_190_735_360), (LLAMA31_8B, 8_030_261_248)],
                         ids=["Qwen3-8B", "Llama-3.1-8B"])
def test_real_8b_configs_have_their_parameter_counts(hf, count):
    """The published parameter counts of the two checkpoints (their safetensors indexes' totals)."""
    cfg = from_hf_config(hf)
    assert count_params(jax.eval_shape(lambda: abstract_params(cfg))) == count
    ours = transformers.AutoConfig.for_model(**hf)
    assert cfg.num_layers == ours.num_hidden_layers and cfg.head_dim == 128


@pytest.mark.parametrize("change,message", [
    (dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=8), "mixture-of-experts"),
    (dict(use_sliding_window=True, sliding_window=4096), "sliding-window attention"),
    (dict(layer_types=["full_attention", "sliding_attention"] * 18), "layer_types other than full_attention"),
    (dict(rope_scaling=dict(rope_type="longrope", factor=4.0)), "rope_scaling type 'longrope' is not supported"),
    (dict(rope_scaling=dict(rope_type="llama3", factor=8.0)), "needs original_max_position_embeddings"),
    (dict(rope_scaling=dict(rope_type="linear", factor=2.0, mystery=1)), "option\\(s\\) mystery"),
    (dict(rope_scaling=dict(rope_type="linear", factor=2.0, attention_factor=2.0)), "only supported with type 'yarn'"),
    (dict(partial_rotary_factor=0.5), "partial rotary"),
    (dict(rope_scaling=dict(rope_type="linear", factor=-1.0)), "factor must be a positive number"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_unsupported_options_are_refused_by_name(change, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**QWEN3_8B, **change})


@pytest.mark.parametrize("name", ["qwen3-untied-kv1", "llama3.1-rope"])
def test_the_train_step_learns_on_the_new_families(name):
    """The same train step (consistency + AR losses over a packed Jacobi-trajectory batch) runs on Qwen3 and on
    llama3 RoPE scaling: the loss falls, and every parameter (Qwen3's q/k norms included) gets a gradient."""
    from jf_jax.model.sharding import ShardingRules, make_mesh
    from jf_jax.training.losses import LossConfig
    from jf_jax.training.state import OptimConfig, init_state, make_optimizer, state_shardings
    from jf_jax.training.step import make_train_step, put_batch
    from tests.support.train_models import synthetic_batch

    cfg, params = jax_twin(_model(name, seed=1))
    mesh, rules, steps = make_mesh(devices=jax.devices()[:1]), ShardingRules(), 12
    ocfg = OptimConfig(learning_rate=3e-3)
    optimizer = make_optimizer(cfg, ocfg, steps)
    shardings = state_shardings(cfg, optimizer, params, mesh, rules)
    state = jax.device_put(init_state(params, optimizer), shardings)
    step = make_train_step(cfg, LossConfig(), ocfg, steps, mesh, rules, shardings)
    batch = put_batch(synthetic_batch(cfg.vocab_size, 4, 48), mesh, rules)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss/total"]))
    assert all(np.isfinite(losses)) and losses[-1] < 0.7 * losses[0], losses
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), params, state.params)
    assert all(jax.tree.leaves(moved)), moved
    if name.startswith("qwen3"):
        assert "q_norm" in params["layers"] and "k_norm" in params["layers"]
