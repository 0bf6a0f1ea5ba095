"""The Flax NNX face: an ``nnx.Module`` over the declared parameter tree that runs the functional forward, splits back
into the functional params, and whose ``nnx.Optimizer`` step equals the functional train step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jf_jax.flax as jfx
from jf_jax import weights
from jf_jax.model.params import logical_axes
from jf_jax.model.transformer import forward_logits
from jf_jax.training.losses import LossConfig
from jf_jax.training.packing import make_batch, pack_example
from jf_jax.training.state import OptimConfig, init_state, make_optimizer
from jf_jax.training.step import train_step
from tests.support.train_models import TINY, numpy_params
from tests.test_losses import _examples


def _equal_trees(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_state_is_the_declared_tree_and_logits_are_the_functional_ones():
    params = numpy_params(TINY, seed=1)
    model = jfx.Transformer(TINY, params=params)
    tokens = np.random.RandomState(0).randint(0, TINY.vocab_size, (2, 9))
    ours, _ = forward_logits(params, TINY, tokens)
    assert np.array_equal(np.asarray(model(tokens)), np.asarray(ours)) and model(tokens).dtype == jnp.float32
    graphdef, state = nnx.split(model)
    assert _equal_trees(jfx.functional_params(model), params)
    assert _equal_trees(jax.tree.map(lambda v: v[...], nnx.to_pure_dict(state)["params"]), params)
    params_state = nnx.state(model, nnx.Param)["params"]
    for path, leaf in jax.tree_util.tree_leaves_with_path(logical_axes(TINY), is_leaf=lambda x: isinstance(x, tuple)):
        node = params_state
        for key in path:
            node = node[key.key]
        assert node.get_metadata()["logical_axes"] == leaf
    merged = nnx.merge(graphdef, state)
    assert np.array_equal(np.asarray(merged(tokens)), np.asarray(ours))


def test_fresh_weights_and_bad_arguments():
    model = jfx.Transformer(TINY, rngs=nnx.Rngs(0))
    assert jax.tree.structure(jfx.functional_params(model)) == jax.tree.structure(numpy_params(TINY))
    with pytest.raises(ValueError, match="exactly one of rngs"):
        jfx.Transformer(TINY)
    with pytest.raises(ValueError, match="tokens must be"):
        model(jnp.zeros((3,), jnp.int32))
    broken = numpy_params(TINY)
    broken["final_norm"] = broken["final_norm"][:3]
    with pytest.raises(ValueError, match="final_norm"):
        jfx.Transformer(TINY, params=broken)


def test_from_pretrained_matches_the_loader(tiny_gguf):
    model = jfx.Transformer.from_pretrained(str(tiny_gguf))
    loaded = weights.load(str(tiny_gguf))
    tokens = np.arange(12)[None] % loaded.cfg.vocab_size
    ours, _ = forward_logits(loaded.params, loaded.cfg, tokens)
    assert np.array_equal(np.asarray(model(tokens)), np.asarray(ours))
    assert jfx.Transformer.from_pretrained(str(tiny_gguf), dtype="bfloat16").cfg.dtype == "bfloat16"


def test_an_nnx_optimizer_step_equals_the_functional_train_step():
    params = numpy_params(TINY, seed=2)
    rows = [[pack_example(ex, eos_id=1, pad_id=0)] for ex in _examples()]
    batch = {k: jnp.asarray(v) for k, v in make_batch(rows, 64, pad_id=0).items()}
    lcfg, ocfg = LossConfig(consistency_weight=5.0), OptimConfig(learning_rate=1e-2, warmup_steps=0, weight_decay=0.1)
    tx = make_optimizer(TINY, ocfg, total_steps=10)

    functional, _ = jax.jit(lambda s, b: train_step(s, b, cfg=TINY, lcfg=lcfg, ocfg=ocfg, optimizer=tx,
                                                    total_steps=10))(init_state(params, tx), batch)

    model = jfx.Transformer(TINY, params=params)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def nnx_step(model, optimizer, batch):
        (loss, _), grads = nnx.value_and_grad(lambda m: jfx.jacobi_forcing_loss(m, batch, lcfg), has_aux=True)(model)
        optimizer.update(model, grads)
        return loss

    nnx_step(model, optimizer, batch)
    after = jfx.functional_params(model)
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(params)))
    assert moved > 1e-3  # the step really moved the weights
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(functional.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
