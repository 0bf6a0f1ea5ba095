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
