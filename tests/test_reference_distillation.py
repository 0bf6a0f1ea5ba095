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
from jf_jax.training.losses import LossConfig, batch_meta, loss_fn, reference_logits, weighted_sums_from_logits
from jf_jax.training.packing import BatchStream, assign_rows, make_batch, pack_example
from pallas_kernels.mask import MASK_KINDS, STREAM_NOISY
from jf_jax.training.step import reference_params
from tests.support.train_models import TINY, numpy_params
from tests.test_losses import _examples, _hand_batch, _np_log_softmax
from tests.test_train import SHORT, TINY_YAML


def _taught_batch():
    """The hand batch with a teacher index over some of each row's tokens (every AR-weighted one among them)."""
    b = _hand_batch()
    b["teacher_index"] = np.array([[0, 1, 2, 3, 4], [0, 1, 2, -1, -1]], np.int32)
    return b


def test_kl_against_numpy():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(2, 6, 7)).astype(np.float32) * 3
    r = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3  # the reference's logits at the teacher index
    b = _taught_batch()
    sums = jax.jit(weighted_sums_from_logits)(jnp.asarray(z), {k: jnp.asarray(v) for k, v in b.items()},
                                                jnp.asarray(r))
    logp, logr = _np_log_softmax(z.astype(np.float64)), _np_log_softmax(r.astype(np.float64))
    kl = [b["ar_weight"][row, p] * (np.exp(logr[row, t]) * (logr[row, t] - logp[row, p])).sum()
          for row in range(2) for t, p in enumerate(b["teacher_index"][row]) if p >= 0]
    np.testing.assert_allclose(sums["ar"], sum(kl), rtol=1e-5)
    assert sum(1 for k in kl if k > 0.01) == int((b["ar_weight"] > 0).sum())  # real, non-trivial divergences
    plain = jax.jit(weighted_sums_from_logits)(jnp.asarray(z), {k: jnp.asarray(v) for k, v in b.items()})
    np.testing.assert_allclose(sums["consistency"], plain["consistency"], rtol=1e-6)  # untouched


def test_reference_logits_get_no_gradient_and_weights_select_positions():
    rng = np.random.default_rng(5)
    z = jnp.asarray(rng.normal(size=(2, 6, 7)), jnp.float32)
    r = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)
    b = {k: jnp.asarray(v) for k, v in _taught_batch().items()}
    g_ref = jax.grad(lambda r: weighted_sums_from_logits(z, b, r)["ar"])(r)
    assert not np.asarray(g_ref).any()
    g = np.abs(np.asarray(jax.grad(lambda z: weighted_sums_from_logits(z, b, r)["ar"])(z))).sum(-1)
    np.testing.assert_array_equal(g > 0, np.asarray(b["ar_weight"]) > 0)


def _packed_batch():
    seqs = [pack_example(e, eos_id=1, pad_id=0) for e in _examples(seed=6)]
    return {k: jnp.asarray(v) for k, v in make_batch([[s] for s in seqs], 40, pad_id=0).items()}


def _rows_batch(teacher_tokens, seed=7):
    """Several sequences per row, an all-padding row, and teacher lengths of ``teacher_tokens``."""
    seqs = [pack_example(e, eos_id=1, pad_id=0) for e in _examples(seed=seed) + _examples(seed=seed + 1)]
    rows = assign_rows([len(s) for s in seqs], 64)
    assert any(len(r) > 1 for r in rows)
    batch = make_batch([[seqs[i] for i in r] for r in rows], 64, pad_id=0, batch_size=len(rows) + 1,
                       teacher_len=64 if teacher_tokens == "all" else 48, teacher_tokens=teacher_tokens)
    return {k: jnp.asarray(v) for k, v in batch.items()}


@pytest.mark.parametrize("mask", MASK_KINDS)
def test_the_reference_over_prompt_and_clean_tokens_alone_gives_its_whole_row_logits(mask):
    """What makes the short teacher exact: prompt and clean tokens never see a noisy token, so the reference's
    logits over them alone equal its logits at the same places in the whole packed row, and the losses agree."""
    params, other = numpy_params(TINY, seed=3), numpy_params(TINY, seed=4)
    lcfg = LossConfig(ar_teacher="reference", mask=mask)
    short, whole = _rows_batch("clean"), _rows_batch("all")
    index = np.asarray(short["teacher_index"])
    assert index.shape[1] < short["tokens"].shape[1]  # the short teacher runs over fewer tokens than the row
    row_logits, _ = model.forward(other, TINY, short["tokens"], meta=batch_meta(short), mask_kind=mask)
    row_logits = np.asarray(model.logits(other, TINY, row_logits))
    taught = np.asarray(jax.jit(reference_logits, static_argnums=(1, 3))(other, TINY, short, lcfg))
    for b, t in zip(*np.nonzero(index >= 0)):
        np.testing.assert_allclose(taught[b, t], row_logits[b, index[b, t]], rtol=1e-5, atol=1e-5)
    run = jax.jit(loss_fn, static_argnums=(1, 3))
    _, m_short = run(params, TINY, short, lcfg, None, other)
    _, m_whole = run(params, TINY, whole, lcfg, None, other)
    assert float(m_short["loss/ar"]) > 0.01
    for key in ("loss/ar", "loss/consistency", "loss/total"):
        np.testing.assert_allclose(float(m_short[key]), float(m_whole[key]), rtol=1e-5, err_msg=key)


def test_teacher_index_lists_every_ar_target_and_no_noisy_token():
    seqs = [pack_example(e, eos_id=1, pad_id=0) for e in _examples(seed=8) + _examples(seed=9)]
    stream = BatchStream(seqs, batch_size=2, buckets=[24, 40], pad_id=0, seed=0)
    packed = BatchStream(seqs, batch_size=2, buckets=[24, 40], pad_id=0, seed=0, pack_rows=True)
    assert all(stream.teacher_lengths[b] < b for b in stream.teacher_lengths)  # one sequence per row: shorter
    assert packed.teacher_lengths == {b: b for b in packed.teacher_lengths}  # several: the row's length
    for step in range(4):
        batch = stream.batch(step)
        for b in range(batch["tokens"].shape[0]):
            listed = batch["teacher_index"][b][batch["teacher_index"][b] >= 0]
            assert (np.diff(listed) > 0).all()
            assert set(np.flatnonzero(batch["ar_weight"][b] > 0)) <= set(listed)
            assert set(listed) == set(np.flatnonzero((batch["segment"][b] >= 0)
                                                     & (batch["stream"][b] != STREAM_NOISY)))
    with pytest.raises(ValueError, match="teacher_len=8"):
        make_batch([[seqs[0]]], 40, pad_id=0, teacher_len=8)


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
    with pytest.raises(ConfigKeyError, match="needs loss.ar_teacher=reference"):
        load_config(TINY_YAML, ["loss.ar_reference=smollm2-135m"])
    with pytest.raises(ConfigKeyError, match="teacher_tokens must be one of"):
        load_config(TINY_YAML, ["loss.teacher_tokens=noisy"])


def test_a_named_reference_model_is_the_teacher_and_must_match_the_architecture(tmp_path):
    """loss.ar_reference: a later round distils from a named model (here another run) instead of its initial
    weights; a model of another shape is refused before training."""
    other = run_training(load_config(TINY_YAML, SHORT + ["train.steps=3"]), str(tmp_path / "other"), progress=False)
    base = SHORT + ["loss.ar_teacher=reference", "train.steps=1"]
    own = run_training(load_config(TINY_YAML, base), str(tmp_path / "own"), progress=False)
    named = run_training(load_config(TINY_YAML, base + [f"loss.ar_reference={other.run_dir}"]),
                         str(tmp_path / "named"), progress=False)
    assert own.metrics[1]["loss/ar"] < 1e-5  # its own initial weights: no divergence at the first step
    assert named.metrics[1]["loss/ar"] > 1e-3  # the other run's trained weights differ from this init
    wide = run_training(load_config(TINY_YAML, SHORT + ["train.steps=1", "model.config.intermediate_size=96"]),
                        str(tmp_path / "wide"), progress=False)
    with pytest.raises(ConfigKeyError, match="does not have the trained model's architecture"):
        run_training(load_config(TINY_YAML, base + [f"loss.ar_reference={wide.run_dir}"]), str(tmp_path / "bad"),
                     progress=False)


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
