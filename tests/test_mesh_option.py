"""``--mesh data=D,fsdp=F,tensor=T`` (``jf_jax.cli.mesh``): parsed with the command line, checked against the
devices before any model loads, and a model whose heads the tensor axis cannot split refused by name."""

import argparse

import pytest

from jf_jax.cli import mesh as mesh_option
from jf_jax.cli.decode import main as decode_main
from jf_jax.model.config import ModelConfig


@pytest.mark.parametrize("text, spec", [("tensor=2", (1, 1, 2)), ("data=2, tensor=4", (2, 1, 4)),
                                        ("fsdp=8", (1, 8, 1))])
def test_a_mesh_names_its_axes(text, spec):
    parsed = mesh_option.parse_mesh(text)
    assert (parsed.data, parsed.fsdp, parsed.tensor) == spec
    assert mesh_option.parse_mesh(str(parsed)) == parsed


@pytest.mark.parametrize("text", ["tensor", "pipeline=2", "tensor=two", "tensor=2,tensor=2", ""])
def test_a_malformed_mesh_is_refused_by_the_parser(text):
    with pytest.raises(argparse.ArgumentTypeError):
        mesh_option.parse_mesh(text)


def test_a_mesh_larger_than_the_devices_is_refused_before_loading(monkeypatch, capsys):
    import jf_jax.api

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(jf_jax.api, "load_model", no_load)
    assert decode_main(["--prompt", "hi", "--mesh", "tensor=64", "--methods", "ar"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--mesh data=1,fsdp=1,tensor=64" in err and "does not fit" in err
    assert "xla_force_host_platform_device_count" in err


def test_heads_that_do_not_divide_the_tensor_axis_are_named():
    cfg = ModelConfig(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=1,
                      num_heads=9, num_kv_heads=3, head_dim=16, rope_theta=1e4, rms_norm_eps=1e-6,
                      max_position_embeddings=64, attention_bias=False, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="query heads 9 and KV heads 3 do not divide the tensor axis of 2"):
        mesh_option.build_mesh(mesh_option.MeshSpec(tensor=2), cfg)
    assert mesh_option.build_mesh(None, cfg) is None


def test_heads_are_checked_from_the_config_before_the_weights_load(monkeypatch, capsys):
    """The embedded SmolLM2's 9 query and 3 KV heads against tensor=2, read from its GGUF's metadata: refused in one
    line naming the model, with ``weights.load`` never called (devices taken as enough)."""
    import jf_jax.api
    from jf_jax import weights
    from jf_jax.model import sharding

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(jf_jax.api, "load_model", no_load)
    monkeypatch.setattr(weights, "load", no_load)
    monkeypatch.setattr(sharding, "mesh_problem", lambda *args: None)
    assert decode_main(["--prompt", "hi", "--mesh", "tensor=2", "--methods", "ar"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "smollm2-135m" in err, err
    assert "query heads 9 and KV heads 3 do not divide the tensor axis of 2" in err
    assert mesh_option.mesh_error(mesh_option.MeshSpec(tensor=3), ["smollm2-135m"]) is None  # 9 and 3 split 3 ways
