"""Training in bfloat16 with float32 master weights: ``mixed_einsum``'s backward (bf16 dots, float32 accumulation,
float32 weight gradients) and per-layer rematerialisation give the gradients they stand for."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax.model.weight_matmul import mixed_einsum
from jf_jax.training.losses import LossConfig, loss_fn
from jf_jax.training.packing import make_batch, pack_example
from tests.support.train_models import TINY, numpy_params
from tests.test_losses import _examples


EQUATIONS = [("btd,dhk->bthk", (2, 5, 8), (8, 3, 4)), ("bthk,hkd->btd", (2, 5, 3, 4), (3, 4, 8)),
             ("nd,vd->nv", (6, 8), (16, 8))]


@pytest.mark.parametrize("equation,x_shape,w_shape", EQUATIONS)
def test_float32_gradients_are_autodiffs(equation, x_shape, w_shape):
    x = jax.random.normal(jax.random.PRNGKey(0), x_shape)
    w = jax.random.normal(jax.random.PRNGKey(1), w_shape)
    cot = jax.random.normal(jax.random.PRNGKey(2), jnp.einsum(equation, x, w).shape)
    ours = jax.vjp(lambda a, b: mixed_einsum(equation, a, b), x, w)[1](cot)
    plain = jax.vjp(lambda a, b: jnp.einsum(equation, a, b), x, w)[1](cot)
    for a, b in zip(ours, plain):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation,x_shape,w_shape", EQUATIONS)
def test_bfloat16_backward_keeps_a_float32_weight_gradient(equation, x_shape, w_shape):
    x = jax.random.normal(jax.random.PRNGKey(0), x_shape).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.PRNGKey(1), w_shape)  # float32 master weight
    out, vjp = jax.vjp(lambda a, b: mixed_einsum(equation, a, b), x, w)
    assert out.dtype == jnp.float32
    cot = jax.random.normal(jax.random.PRNGKey(2), out.shape)
    dx, dw = vjp(cot)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    # The same product in float64 from the bf16-rounded operands: the only difference is bf16 rounding.
    x64, w64 = np.asarray(x, np.float64), np.asarray(w.astype(jnp.bfloat16), np.float64)
    c64 = np.asarray(cot.astype(jnp.bfloat16), np.float64)
    ref_dx, ref_dw = jax.vjp(lambda a, b: jnp.einsum(equation, a, b), x64, w64)[1](c64)
    np.testing.assert_allclose(np.asarray(dw, np.float64), ref_dw, rtol=1e-5, atol=1e-5)  # float32 accumulation
    np.testing.assert_allclose(np.asarray(dx, np.float64), ref_dx, rtol=2e-2, atol=2e-2)  # one bf16 rounding


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_remat_changes_no_gradient(dtype):
    params = numpy_params(TINY, seed=0)
    rows = [[pack_example(ex, eos_id=1, pad_id=0)] for ex in _examples()]
    batch = {k: jnp.asarray(v) for k, v in make_batch(rows, 64, pad_id=0).items()}
    grads = {}
    for remat in (False, True):
        cfg = TINY.replace(dtype=dtype, param_dtype="float32", remat=remat)
        grads[remat] = jax.jit(jax.grad(lambda p: loss_fn(p, cfg, batch, LossConfig())[0]))(params)
    for a, b in zip(jax.tree.leaves(grads[False]), jax.tree.leaves(grads[True])):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_bfloat16_weight_gradient_of_a_2d_dot_stays_in_bfloat16_on_the_cpu():
    """The tied LM head's gradient ("nd,vd->nv": dw contracts both operands' row axis) compiles to a bf16
    YNNPACK dot, not a float32 dot of converted operands (XLA:CPU's choice for such 2-D dots, half the speed)."""
    if jax.default_backend() != "cpu":
        pytest.skip("an XLA:CPU code-generation property")
    x = jnp.zeros((256, 128), jnp.bfloat16)
    w = jnp.zeros((1024, 128), jnp.float32)

    def weight_grad(x, w, cot):
        return jax.vjp(lambda b: mixed_einsum("nd,vd->nv", x, b), w)[1](cot)[0]

    hlo = jax.jit(weight_grad).lower(x, w, jnp.zeros((256, 1024), jnp.float32)).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    assert "__ynn_fusion" in entry, entry
    assert " dot(" not in entry, entry  # the weight gradient's dot is inside it too, not a float32 dot


def test_the_embedded_models_written_out_config_is_the_loaded_one():
    """The embedded model's written-out configuration (bench_train_step.py --random-init) stays the loaded one's."""
    from jf_jax import weights
    from jf_jax.weights import embedded

    loaded = weights.load("smollm2-135m").cfg
    ours = embedded.SMOLLM2_135M_CONFIG
    assert ours.replace(rms_norm_eps=loaded.rms_norm_eps) == loaded
    assert ours.rms_norm_eps == pytest.approx(loaded.rms_norm_eps, rel=1e-6)  # the GGUF stores it as float32
