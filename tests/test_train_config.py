"""Training configs extend each other with ``base:``: merged key by key, strict keys kept, loops and missing
files named; the repository's per-run configs hold only what differs from their base."""

import pathlib

import pytest
import yaml

from jf_jax.training.config import ConfigKeyError, load_config, merge, read_config_file

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"
BASES = ("recipe.yaml", "smollm2.yaml")  # partial configs: recipe and model sections, extended by every run


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_merge_goes_into_mappings_and_replaces_everything_else():
    base = {"data": {"block_size": 16, "buckets": [256, 512]}, "seed": 0}
    assert merge(base, {"data": {"buckets": [640]}, "seed": 3}) == {"data": {"block_size": 16, "buckets": [640]},
                                                                     "seed": 3}
    assert base["data"]["buckets"] == [256, 512]  # inputs untouched


def test_a_config_extends_its_bases_in_order(tmp_path):
    _write(tmp_path / "a.yaml", "data: {block_size: 8, window: 2}\noptim: {learning_rate: 1.0}\n")
    _write(tmp_path / "b.yaml", "optim: {learning_rate: 2.0, warmup_steps: 3}\n")
    sub = tmp_path / "runs"
    sub.mkdir()
    child = _write(sub / "c.yaml", "base: [../a.yaml, ../b.yaml]\nrun_name: c\ndata: {window: 4}\n")
    assert read_config_file(child) == {"data": {"block_size": 8, "window": 4},
                                       "optim": {"learning_rate": 2.0, "warmup_steps": 3}, "run_name": "c"}


def test_unknown_keys_in_a_base_are_still_refused(tmp_path):
    _write(tmp_path / "base.yaml", "data: {bukets: [64]}\n")
    child = _write(tmp_path / "run.yaml", "base: base.yaml\nmodel: {source: pretrained, path: x}\n"
                                          "data: {path: [d]}\n")
    with pytest.raises(ConfigKeyError, match="bukets"):
        load_config(child)


def test_a_loop_and_a_missing_base_are_named(tmp_path):
    a = _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigKeyError, match="chain loops"):
        read_config_file(a)
    lone = _write(tmp_path / "lone.yaml", "base: nowhere.yaml\n")
    with pytest.raises(ConfigKeyError, match=r"nowhere.yaml does not exist \(the 'base' of"):
        read_config_file(lone)
    bad = _write(tmp_path / "bad.yaml", "base: {a: 1}\n")
    with pytest.raises(ConfigKeyError, match="must be a file name"):
        read_config_file(bad)


def _leaves(d, prefix=""):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _lookup(d, dotted):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return KeyError
        d = d[part]
    return d


@pytest.mark.parametrize("path", sorted(p.name for p in CONFIGS.glob("*.yaml") if p.name not in BASES))
def test_run_configs_hold_only_what_differs_from_their_base(path):
    own = yaml.safe_load((CONFIGS / path).read_text())
    assert "base" in own, f"{path} copies a whole config instead of extending configs/recipe.yaml or another"
    base = {}
    for name in [own["base"]] if isinstance(own["base"], str) else own["base"]:
        base = merge(base, read_config_file(str(CONFIGS / name)))
    repeated = [key for key, value in _leaves({k: v for k, v in own.items() if k != "base"})
                if key != "data.path" and _lookup(base, key) == value]
    assert not repeated, f"{path} repeats what its base already says: {repeated}"
    load_config(str(CONFIGS / path))  # and it resolves to a valid TrainConfig


def test_the_attention_kernel_and_its_backward_are_config_keys(monkeypatch):
    """model.attention_impl / model.attention_backward reach the ModelConfig the run trains, and the forward hands
    the backward to the kernel (the fallback a user picks when a fused backward does not compile on a device)."""
    import jax
    import jax.numpy as jnp

    from jf_jax.model import transformer
    from jf_jax.model.config import ATTENTION_BACKWARDS
    from jf_jax.training import setup as train_setup
    from pallas_kernels import flash_attention

    assert ATTENTION_BACKWARDS == flash_attention.BACKWARDS
    tiny = str(CONFIGS / "tiny.yaml")
    cfg = train_setup.model_config(load_config(tiny, ["model.attention_impl=pallas_triton",
                                                     "model.attention_backward=reference"]))
    assert (cfg.attention_impl, cfg.attention_backward) == ("pallas_triton", "reference")
    assert train_setup.model_config(load_config(tiny)).attention_backward == "fused"
    with pytest.raises(ConfigKeyError, match="attention_backward must be one of"):
        load_config(tiny, ["model.attention_backward=dense"])

    seen = []
    monkeypatch.setattr(flash_attention, "attention", lambda *a, **kw: seen.append(kw["backward"]) or a[0])
    q = jnp.zeros((1, 4, cfg.num_heads, cfg.head_dim), jnp.float32)
    k = jnp.zeros((1, 4, cfg.num_kv_heads, cfg.head_dim), jnp.float32)
    meta = transformer.causal_meta(jnp.arange(4)[None])
    jax.eval_shape(lambda: transformer._attend(cfg, q, k, k, meta, meta, "noise_conditioned"))
    assert seen == ["reference"]
