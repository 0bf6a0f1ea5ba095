"""Parameter declaration, full-size configs without allocation, and clear errors on malformed configs."""

import jax
import numpy as np
import pytest

from jf_jax.model.config import QWEN2P5_7B_HF_CONFIG, ConfigError, ModelConfig, from_hf_config
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.transformer import forward_logits
from jf_jax.model.params import abstract_params, check_params, count_params, init_params, logical_axes, param_specs


def test_qwen2p5_7b_parameter_count_without_allocating():
    cfg = from_hf_config(QWEN2P5_7B_HF_CONFIG, param_dtype="bfloat16", dtype="bfloat16")
    abstract = abstract_params(cfg)
    # Qwen2.5-7B has 7.62B parameters (untied 152064-row embedding and lm_head, q/k/v biases, GQA 28/4).
    assert count_params(abstract) == 7_615_616_512
    assert abstract["layers"]["wk"].shape == (28, 3584, 4, 128)
    assert abstract["layers"]["bq"].shape == (28, 28, 128)
    # A whole prefill + cached decode step, traced on abstract values: shapes only, nothing allocated.
    cache = KVCache.abstract(cfg, batch_size=1, capacity=4096)
    tokens = jax.ShapeDtypeStruct((1, 64), np.int32)
    out, new_cache = jax.eval_shape(lambda p, c, t: forward_logits(p, cfg, t, cache=c), abstract, cache, tokens)
    assert out.shape == (1, 64, 152064) and out.dtype == np.float32
    assert new_cache.k.shape == (28, 1, 4096, 4, 128)


def test_every_parameter_is_declared_once_with_axes():
    cfg = from_hf_config(QWEN2P5_7B_HF_CONFIG)
    specs, axes = param_specs(cfg), logical_axes(cfg)
    leaves = jax.tree.leaves(specs, is_leaf=lambda x: hasattr(x, "axes"))
    assert all(len(s.shape) == len(s.axes) for s in leaves)
    assert axes["layers"]["wq"] == ("layers", "embed", "q_heads", "head_dim")
    assert "lm_head" in specs and "lm_head" not in param_specs(cfg.replace(tie_word_embeddings=True))


def test_init_matches_abstract_and_check_params_names_problems():
    cfg = ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6,
                      max_position_embeddings=128, attention_bias=False, tie_word_embeddings=True)
    params = init_params(cfg, jax.random.key(0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(lambda x: (x.shape, x.dtype),
                                                                               abstract_params(cfg))
    check_params(cfg, params)
    broken = {**params, "layers": {**params["layers"], "wq": params["layers"]["wq"][:, :, :2]}}
    with pytest.raises(ValueError, match=r"wq.*shape"):
        check_params(cfg, broken)
    missing = {k: v for k, v in params.items() if k != "final_norm"}
    with pytest.raises(ValueError, match="missing tensor.*final_norm"):
        check_params(cfg, missing)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}, "unknown architecture"),
    ({"num_key_value_heads": 5}, "multiple of num_kv_heads"),
    ({"hidden_size": -1}, "hidden_size must be a positive integer"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_scaling type 'longrope' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_malformed_configs_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**QWEN2P5_7B_HF_CONFIG, **change})


def test_missing_keys_and_unknown_keys():
    partial = {k: v for k, v in QWEN2P5_7B_HF_CONFIG.items() if k != "num_hidden_layers"}
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        from_hf_config(partial)
    cfg = from_hf_config(QWEN2P5_7B_HF_CONFIG)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown model config keys: bogus"):
        ModelConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ConfigError, match="attention_impl"):
        cfg.replace(attention_impl="magic")


def test_auto_attention_is_the_reference_off_gpu_and_the_gpu_extra_stays_optional():
    import pathlib
    import tomllib

    import jax
    import numpy as np

    from jf_jax.model.config import ModelConfig
    from jf_jax.model.transformer import forward_logits
    from tests.support.train_models import TINY, numpy_params

    assert ModelConfig.__dataclass_fields__["attention_impl"].default == "auto"
    params = numpy_params(TINY, seed=3)
    tokens = np.arange(7)[None] % TINY.vocab_size
    auto, _ = forward_logits(params, TINY.replace(attention_impl="auto"), tokens)
    ref, _ = forward_logits(params, TINY.replace(attention_impl="reference"), tokens)
    assert jax.default_backend() != "gpu" and np.array_equal(np.asarray(auto), np.asarray(ref))
    root = pathlib.Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    gpu = project["optional-dependencies"]["gpu"]
    assert any(d.startswith("jax[cuda12]") for d in gpu) and any(d.startswith("jax-triton") for d in gpu)
    cpu = (root / "requirements.txt").read_text() + " ".join(project["dependencies"])
    assert "cuda" not in cpu and "triton" not in cpu


def test_sharding_rules_map_logical_axes_through_flax():
    import jax

    from jf_jax.model.sharding import ShardingRules, make_mesh
    from jax.sharding import PartitionSpec as P

    mesh = make_mesh(1, 1, jax.devices()[:1])
    rules = ShardingRules(rules=(("embed", "fsdp"), ("mlp", "fsdp"), ("vocab", "data")))
    assert rules.spec(("layers", "embed", "mlp"), (2, 8, 16), mesh) == P(None, "fsdp", None)  # first claim wins
    assert rules.spec(("vocab", "embed"), (10, 8), mesh) == P("data", "fsdp")
    unlisted = ShardingRules(rules=(("embed", "fsdp"),))
    assert unlisted.spec(("layers", "q_heads"), (2, 4), mesh) == P(None, None)  # unlisted: replicated
    assert ShardingRules().spec(("layers", "q_heads"), (2, 4), mesh) == P(None, "tensor")  # the default rules
