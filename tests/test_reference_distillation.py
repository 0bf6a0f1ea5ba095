"""The AR term distilled from a frozen reference model (``loss.ar_teacher=reference``): KL by hand, zero loss and
zero AR gradient when the model is its reference, the reference gets no gradient, a bfloat16 reference copy gives
its float32 original's logits, clear errors, and a training run with it resumes exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax.model import transformer as model
from jf_jax.training.config import ConfigKeyError, load_config
from jf_jax.training.loop import run_training
from jf_jax.training.losses import LossConfig, loss_fn, weighted_sums_from_logits
from jf_jax.training.packing import make_batch, pack_example
from jf_jax.training.step import reference_params
from tests.support.train_models import TINY, numpy_params
from tests.test_losses import _examples, _hand_batch, _np_log_softmax
from tests.test_train import SHORT, TINY_YAML


def test_kl_against_numpy():
    rng = np.random.default_rng(4)
    z, r = (rng.normal(size=(2, 6, 7)).astype(np.float32) * 3 for _ in range(2))
    b = _hand_batch()
    sums = jax.jit(weighted_sums_from_logits)(jnp.asarray(z), {k: jnp.asarray(v) for k, v in b.items()},
                                                jnp.asarray(r))
    logp, logr = _np_log_softmax(z.astype(np.float64)), _np_log_softmax(r.astype(np.float64))
    kl = (np.exp(logr) * (logr - logp)).sum(-1)
    np.testing.assert_allclose(sums["ar"], (b["ar_weight"] * kl).sum(), rtol=1e-5)
    assert (kl[b["ar_weight"] > 0] > 0.01).all()  # the check compares real, non-trivial divergences
    plain = jax.jit(weighted_sums_from_logits)(jnp.asarray(z), {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(sums["consistency"], plain["consistency"], rtol=1e-6)  # untouched


def test_reference_logits_get_no_gradient_and_weights_select_positions():
    rng = np.random.default_rng(5)
    z, r = (jnp.asarray(rng.normal(size=(2, 6, 7)), jnp.float32) for _ in range(2))
    b = {k: jnp.asarray(v) for k, v in _hand_batch().items()}
    g_ref = jax.grad(lambda r: weighted_sums_from_logits(z, b, r)["ar"])(r)
    assert not np.asarray(g_ref).any()
    g = np.abs(np.asarray(jax.grad(lambda z: weighted_sums_from_logits(z, b, r)["ar"])(z))).sum(-1)
    np.testing.assert_array_equal(g > 0, np.asarray(b["ar_weight"]) > 0)


def _packed_batch():
    seqs = [pack_example(e, eos_id=1, pad_id=0) for e in _examples(seed=6)]
    return {k: jnp.asarray(v) for k, v in make_batch([[s] for s in seqs], 40, pad_id=0).items()}


def test_model_equal_to_its_reference_has_zero_ar_loss_and_gradient():
    params, other = numpy_params(TINY, seed=0), numpy_params(TINY, seed=1)
    batch, lcfg = _packed_batch(), LossConfig(ar_teacher="reference", consistency_weight=0.0)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), static_argnums=(1, 3))
    (_, same), grads = grad_fn(params, TINY, batch, lcfg, None, params)
    assert abs(float(same["loss/ar"])) < 1e-6
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) < 1e-5
    (_, apart), grads = grad_fn(params, TINY, batch, lcfg, None, other)
    assert float(apart["loss/ar"]) > 0.01 and max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-3


def test_bfloat16_reference_copy_gives_the_float32_originals_logits():
    cfg = TINY.replace(dtype="bfloat16", param_dtype="float32")  # TINY has attention biases: kept in float32
    params = jax.tree.map(jnp.asarray, numpy_params(TINY, seed=2))
    ref = reference_params(params, cfg)
    assert ref["embed"].dtype == jnp.bfloat16 and ref["layers"]["wq"].dtype == jnp.bfloat16
    assert ref["layers"]["bq"].dtype == jnp.float32 and ref["layers"]["attn_norm"].dtype == jnp.float32
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 9)), jnp.int32)
    run = jax.jit(lambda p: model.forward_logits(p, cfg, tokens)[0])
    np.testing.assert_array_equal(np.asarray(run(ref)), np.asarray(run(params)))


def test_clear_errors():
    with pytest.raises(ValueError, match="needs the reference model"):
        loss_fn(numpy_params(TINY), TINY, _packed_batch(), LossConfig(ar_teacher="reference"))
    with pytest.raises(ConfigKeyError, match="ar_teacher must be one of"):
        load_config(TINY_YAML, ["loss.ar_teacher=teacher"])


def test_run_with_reference_distillation_resumes_exactly(tmp_path):
    tcfg = load_config(TINY_YAML, SHORT + ["loss.ar_teacher=reference", "train.steps=6"])
    full = run_training(tcfg, str(tmp_path / "full"), progress=False)
    assert full.metrics[1]["loss/ar"] < 1e-5 < full.metrics[6]["loss/ar"]  # starts at its reference, then moves

    def kill_at_5(step, metrics):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_training(tcfg, str(tmp_path / "killed"), progress=False, on_step=kill_at_5)
    resumed = run_training(tcfg, str(tmp_path / "killed"), progress=False)  # from the step-3 checkpoint
    assert sorted(resumed.metrics) == [4, 5, 6]
    for step, m in resumed.metrics.items():
        assert m == full.metrics[step], step
