"""The (data, fsdp, tensor) mesh: which meshes the devices hold, which models a tensor axis can split, and where
each parameter goes (the sharded steps themselves: tests/test_train.py, on 8 simulated devices)."""

import jax
import pytest

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import abstract_params
from jf_jax.model.sharding import ShardingRules, make_mesh, mesh_problem, param_shardings, tensor_split_problem

QWEN_7B_HEADS = dict(num_heads=28, num_kv_heads=4)


@pytest.mark.parametrize("sizes, devices, problem", [
    ((1, -1, 1), 8, None), ((2, 2, 2), 8, None), ((1, -1, 4), 8, None), ((2, -1, 2), 8, None),
    ((1, 1, 16), 8, "does not fit the 8 device(s)"), ((3, -1, 1), 8, "does not fit"),
    ((-1, -1, 1), 8, "at most one mesh axis may be -1"), ((1, 0, 1), 8, "positive integers"),
])
def test_mesh_problem_says_which_meshes_the_devices_hold(sizes, devices, problem):
    found = mesh_problem(*sizes, devices)
    assert found is None if problem is None else problem in found


@pytest.mark.parametrize("tensor, problem", [(1, None), (2, None), (4, None), (8, "query heads 28 and KV heads 4"),
                                             (7, "KV heads 4 do not divide")])
def test_a_tensor_axis_must_split_whole_heads(tensor, problem):
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                      head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6, max_position_embeddings=64,
                      attention_bias=True, tie_word_embeddings=False, **QWEN_7B_HEADS)
    found = tensor_split_problem(cfg, tensor)
    assert found is None if problem is None else problem in found


def test_the_rules_put_heads_mlp_and_vocabulary_on_tensor_and_the_hidden_size_on_fsdp():
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6,
                      max_position_embeddings=64, attention_bias=True, tie_word_embeddings=False)
    mesh = make_mesh(1, 1, jax.devices()[:1], tensor=1)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    rules = ShardingRules()
    specs = {k: rules.spec(a, s, mesh) for k, (a, s) in {
        "wq": (("layers", "embed", "q_heads", "head_dim"), (2, 32, 4, 8)),
        "w_down": (("layers", "mlp", "embed"), (2, 64, 32)),
        "embed": (("vocab", "embed"), (64, 32))}.items()}
    # on a one-device mesh every axis divides; the mapping itself is what a bigger mesh shards by
    assert tuple(specs["wq"]) == (None, "fsdp", "tensor", None)
    assert tuple(specs["w_down"]) == (None, "tensor", "fsdp") and tuple(specs["embed"]) == ("tensor", "fsdp")
    shardings = param_shardings(cfg, abstract_params(cfg), mesh, rules)
    assert tuple(shardings["lm_head"].spec) == ("fsdp", "tensor")
