"""The row counts a decode forward gives XLA's dots (``weight_matmul.DotRows``): the policy per machine, and that a
row of a decode matmul gets the same bits at every row count on this machine, for weights with few outputs (where
XLA:CPU chunks the rows of a dot) and many."""

import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.weight_matmul import DotRows, dot_rows, matmul, this_machine_dot_rows

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"})


def test_the_policy_pads_bf16_to_three_rows_only_on_cpus_with_amx():
    assert dot_rows("bfloat16", "cpu", AVX512 | {"amx_bf16", "amx_tile"}) == DotRows(3, 64)
    assert dot_rows("bfloat16", "cpu", AVX512) == DotRows(2, 64)
    assert dot_rows("bfloat16", "cpu", None) == DotRows(2, 64)
    assert dot_rows("float32", "cpu", AVX512 | {"amx_bf16"}) == DotRows(2, 32)
    # Off the CPU fixed decode shapes keep rows invariant: no bf16 tiles (a tile is a sequential loop there).
    assert dot_rows("bfloat16", "gpu", None) == DotRows(2, None)
    assert dot_rows("float32", "tpu", None) == DotRows(2, 32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("outputs", [64, 128, 1536])
def test_a_row_of_a_decode_matmul_gets_the_same_bits_at_every_row_count(dtype, outputs):
    rows = this_machine_dot_rows(dtype)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 140, 576)), dtype)
    w = (jnp.asarray(rng.standard_normal((576, outputs)) * 0.05, dtype),)
    dot = decode_jit(lambda a: matmul("btd,dn->btn", a, w, dtype, rows.tile))
    want = np.asarray(dot(x))[0]
    # Around the fewest rows, the tile and XLA's 64-row chunks (a chunk of one or two rows is computed apart).
    for m in sorted({rows.fewest, rows.fewest + 1, 16, 32, 33, 63, 64, 65, 66, 129, 130, 140}):
        got = np.asarray(dot(x[:, :m]))[0]
        np.testing.assert_array_equal(got, want[:m], err_msg=f"{m} rows")
