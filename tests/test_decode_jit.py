"""``decode_jit`` programs nest: one called inside another's trace is inlined as a plain jit (JAX accepts
compiler options only at the top level; the enclosing program's apply)."""

import jax.numpy as jnp
import numpy as np

from jf_jax.model.decode_jit import decode_jit


@decode_jit
def _double(x):
    return x * 2


@decode_jit(static_argnums=1)
def _double_then_add(x, k: int):
    return _double(x) + k


def test_a_decode_program_called_inside_another_is_inlined():
    np.testing.assert_array_equal(_double_then_add(jnp.ones(3), 1), np.full(3, 3.0))
    np.testing.assert_array_equal(_double(jnp.ones(2)), np.full(2, 2.0))  # and still runs at the top level
    assert _double_then_add.program()._cache_size() == 1


def test_full_float32_precision_reaches_programs_nested_in_a_users_jit(monkeypatch):
    """On a backend whose default float32 matmuls are reduced (TF32 on GPUs), a decode program asks for full
    precision, also when a user's own jit calls it. Shown on the CPU by counting this backend as such a one: the
    dots of both the top-level and the nested program carry HIGHEST precision."""
    import jax

    from jf_jax.model import decode_jit as module

    monkeypatch.setattr(module, "FULL_PRECISION_BACKENDS", module.FULL_PRECISION_BACKENDS + (jax.default_backend(),))

    @module.decode_jit
    def matmul(a, b):
        return a @ b

    a = jnp.ones((4, 4), jnp.float32)
    top = matmul.program().lower(a, a).as_text()
    nested = jax.jit(lambda x, y: matmul(x, y) + 1).lower(a, a).as_text()
    for text in (top, nested):
        assert "HIGHEST" in text, text
    plain = jax.jit(lambda x, y: x @ y).lower(a, a).as_text()
    assert "HIGHEST" not in plain  # the test's premise: the marker comes from decode_jit, not the default
