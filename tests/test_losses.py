"""Losses vs numpy computed by hand, normalisation, stop-gradient, and packed == unpacked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax.training.losses import LossConfig, combine, loss_fn, loss_normalizers, weighted_sums_from_logits
from jf_jax.training.packing import Example, assign_rows, make_batch, pack_ar_example, pack_example
from tests.support.train_models import TINY, numpy_params

_sums = jax.jit(weighted_sums_from_logits)


def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _hand_batch():
    """Two rows of 6 tokens; logits are given directly, so only the loss arithmetic is under test."""
    return dict(
        ar_target=np.array([[1, 2, 0, 3, 4, 0], [2, 2, 1, 0, 0, 0]], np.int32),
        ar_weight=np.array([[1, 1, 0, 1, 1, 0], [1, 0, 1, 0, 0, 0]], np.float32),
        cons_student=np.array([[0, 1, 0], [3, 0, 0]], np.int32),
        cons_teacher=np.array([[3, 4, 0], [5, 0, 0]], np.int32),
        cons_weight=np.array([[0.5, 0.5, 0.0], [1 / 3, 0.0, 0.0]], np.float32),
    )


def test_literal_values():
    # One AR pair with logits (0, 0) over V=2: CE = log 2. One consistency pair: student p = (.25, .75),
    # teacher p = (.5, .5): soft CE = -(.5 log .25 + .5 log .75) = 0.8369882.
    z = jnp.array([[[0.0, 0.0], [0.0, np.log(3.0)], [0.0, 0.0]]], jnp.float32)
    batch = dict(ar_target=jnp.array([[1, 0, 0]]), ar_weight=jnp.array([[1.0, 0, 0]]),
                 cons_student=jnp.array([[1]]), cons_teacher=jnp.array([[2]]), cons_weight=jnp.array([[0.5]]))
    sums = _sums(z, batch)
    np.testing.assert_allclose(sums["ar"], np.log(2.0), rtol=1e-6)
    np.testing.assert_allclose(sums["consistency"], 0.5 * 0.8369882, rtol=1e-6)
    total, metrics = combine(sums, loss_normalizers(batch), LossConfig(ar_weight=10.0, consistency_weight=2.0))
    np.testing.assert_allclose(metrics["loss/consistency"], 0.5 * 0.8369882, rtol=1e-6)  # one kept pair, T=2
    np.testing.assert_allclose(total, 10 * np.log(2.0) + 2 * 0.5 * 0.8369882, rtol=1e-6)


def test_against_numpy_reference():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 6, 7)).astype(np.float32) * 3
    b = _hand_batch()
    sums = _sums(jnp.asarray(z), {k: jnp.asarray(v) for k, v in b.items()})
    logp = _np_log_softmax(z.astype(np.float64))
    ar_terms = [(r, p) for r in range(2) for p in range(6) if b["ar_weight"][r, p]]
    ar = sum(-logp[r, p, b["ar_target"][r, p]] for r, p in ar_terms)
    pairs = [(r, m) for r in range(2) for m in range(3) if b["cons_weight"][r, m] > 0]
    teacher, student = b["cons_teacher"], b["cons_student"]
    cons = sum(b["cons_weight"][r, m] * -(np.exp(logp[r, teacher[r, m]]) * logp[r, student[r, m]]).sum()
               for r, m in pairs)
    np.testing.assert_allclose(sums["ar"], ar, rtol=1e-5)
    np.testing.assert_allclose(sums["consistency"], cons, rtol=1e-5)
    norms = loss_normalizers(b)
    assert float(norms["ar"]) == len(ar_terms) == 6 and float(norms["consistency"]) == len(pairs) == 3
    _, metrics = combine(sums, norms, LossConfig())
    # row 0 has T=2 (weights 1/2), row 1 has T=3: token mean over the 3 kept pairs of ce/T.
    np.testing.assert_allclose(metrics["loss/consistency"], cons / 3, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/ar"], ar / 6, rtol=1e-5)


def test_teacher_gets_no_gradient():
    rng = np.random.default_rng(1)
    z = jnp.asarray(rng.normal(size=(2, 6, 7)), jnp.float32)
    b = {k: jnp.asarray(v) for k, v in _hand_batch().items()}
    g = jax.jit(jax.grad(lambda z: weighted_sums_from_logits(z, b)["consistency"]))(z)
    g = np.abs(np.asarray(g)).sum(-1)
    assert g[0, 3] == 0 and g[0, 4] == 0 and g[1, 5] == 0  # teachers
    assert g[0, 0] > 0 and g[0, 1] > 0 and g[1, 3] > 0  # students


def _examples(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for P, T in ((5, 3), (3, 2), (7, 1)):
        clean = rng.integers(3, TINY.vocab_size, (T, 4)).astype(np.int32)
        noisy = np.where(rng.random((T, 4)) < 0.5, clean, rng.integers(3, TINY.vocab_size, (T, 4))).astype(np.int32)
        out.append(Example(rng.integers(3, TINY.vocab_size, P).astype(np.int32), noisy, clean))
    clean = out[0].clean.copy()
    clean[-1, 1] = 1  # an EOS inside the last block of the first example
    out[0] = Example(out[0].prompt, out[0].noisy, clean)
    return out


@pytest.fixture(scope="module")
def params():
    return numpy_params(TINY, seed=0)


def _loss(params, batch, **kw):
    _, metrics = jax.jit(loss_fn, static_argnums=(1, 3))(params, TINY, {k: jnp.asarray(v) for k, v in batch.items()},
                                                         LossConfig(**kw))
    return {k: float(v) for k, v in metrics.items()}


def test_packed_and_unpacked_layouts_give_the_same_ar_loss(params):
    exs = _examples()
    jf = [pack_example(e, eos_id=1, pad_id=0) for e in exs]
    ar = [pack_ar_example(e, eos_id=1, pad_id=0) for e in exs]
    jf_loss = _loss(params, make_batch([[s] for s in jf], 40, pad_id=0))
    ar_loss = _loss(params, make_batch([[s] for s in ar], 40, pad_id=0))
    np.testing.assert_allclose(jf_loss["loss/ar"], ar_loss["loss/ar"], rtol=2e-6)
    assert jf_loss["loss/consistency"] > 0 and ar_loss["loss/consistency"] == 0
    # Both are real per-token means: equal to the mean of per-sequence sums over all tokens.
    singles = [_loss(params, make_batch([[s]], 40, pad_id=0)) for s in ar]
    counts = [s.ar_weight.sum() for s in ar]
    np.testing.assert_allclose(ar_loss["loss/ar"], np.dot([x["loss/ar"] for x in singles], counts) / sum(counts),
                               rtol=1e-5)


def test_rows_packed_with_segments_equal_one_sequence_per_row(params):
    seqs = [pack_example(e, eos_id=1, pad_id=0) for e in _examples(seed=2)]
    rows = assign_rows([len(s) for s in seqs], 64)
    assert any(len(r) > 1 for r in rows)
    packed = _loss(params, make_batch([[seqs[i] for i in r] for r in rows], 64, pad_id=0))
    separate = _loss(params, make_batch([[s] for s in seqs], 40, pad_id=0, batch_size=4))  # plus a padding row
    for key in ("loss/total", "loss/ar", "loss/consistency"):
        np.testing.assert_allclose(packed[key], separate[key], rtol=2e-6, err_msg=key)


def test_pallas_kernel_gives_the_same_loss_and_gradients(params):
    """The config switch in training: the packed noise-conditioned batch through the Pallas kernel (interpret
    mode on CPU) gives the reference's losses and gradients."""
    seqs = [pack_example(e, eos_id=1, pad_id=0) for e in _examples(seed=3)]
    batch = {k: jnp.asarray(v) for k, v in make_batch([[s] for s in seqs], 40, pad_id=0).items()}
    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), static_argnums=(1, 3))
    with jax.default_matmul_precision("float32"):
        (ref_total, ref_metrics), ref_grads = grad_fn(params, TINY, batch, LossConfig())
        (total, metrics), grads = grad_fn(params, TINY.replace(attention_impl="pallas"), batch, LossConfig())
    assert float(ref_metrics["loss/consistency"]) > 0 and float(ref_metrics["loss/ar"]) > 0
    np.testing.assert_allclose(float(total), float(ref_total), rtol=1e-5)
    for name, value in ref_metrics.items():
        np.testing.assert_allclose(float(metrics[name]), float(value), rtol=1e-5, atol=1e-6, err_msg=name)
    jax.tree.map(lambda g, r: np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5),
                 grads, ref_grads)
