"""``cpu_kernels``: each FFI kernel (bf16 GEMM for AVX-512 and for AVX2, W8A8 matmul, decode attention) and its
plain-JAX twin agree, rows never depend on each other, packing round-trips, the two GEMMs give the same bits, the
AVX2 library holds no AVX-512 instruction, and the decode view built on packed weights gives the model's logits.

A kernel test skips, with the reason, on a machine that cannot run its set (not a CPU; no AVX512-BF16 / VNNI for
the AVX-512 set, no AVX2 / FMA for the AVX2 one); on one that can, a library that is not built or does not load
fails it (``tests.support.kernel_gate``).
"""

import functools
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cpu_kernels
from cpu_kernels.bf16_gemm import KERNELS, gemm_kernel, kernel_target, unpack_weight
from jf_jax.model.cached_attention import cached_attention
from jf_jax.model.decode_view import decode_view, stacked_params
from jf_jax.model.kv_cache import KVCache, write_rows
from jf_jax.model.params import cast_params, init_params
from jf_jax.model.transformer import forward_logits
from tests.support import kernel_gate
from tests.test_cached_attention import MID

needs_kernel = pytest.mark.usefixtures("cpu_kernels_run_here")


@pytest.mark.parametrize("in_shape,out_shape", [((576,), (1536,)), ((9, 64), (290,)), ((64,), (3, 24))])
def test_packing_round_trips(in_shape, out_shape):
    w = np.random.default_rng(0).standard_normal(in_shape + out_shape).astype(np.float32)
    p = cpu_kernels.pack_weight(w, len(in_shape))
    assert p.data.shape[2:] == (16, 2) and p.k == np.prod(in_shape) and p.n == np.prod(out_shape)
    np.testing.assert_array_equal(np.asarray(unpack_weight(p)), np.asarray(jnp.asarray(w, jnp.bfloat16)))


def test_odd_contraction_is_refused():
    with pytest.raises(ValueError, match="even contraction size"):
        cpu_kernels.pack_weight(np.zeros((3, 16)))


GEMMS = {k.kernel_set.name: k.target for k in KERNELS}  # kernel set -> its GEMM's FFI target


@pytest.mark.parametrize("kernel_set", list(GEMMS))
@pytest.mark.parametrize("K,N", [(576, 1536), (1536, 576), (64, 40), (576, 24576)])
def test_gemm_equals_xla_dot_and_rows_are_independent(K, N, kernel_set):
    kernel_gate.apply(kernel_gate.this_machine(kernel_set))
    rng = np.random.default_rng(K + N)
    p = cpu_kernels.pack_weight(rng.standard_normal((K, N)).astype(np.float32))
    x = rng.standard_normal((40, K)).astype(np.float32)
    kernel = jax.jit(functools.partial(gemm_kernel, target=GEMMS[kernel_set]))
    full = np.asarray(kernel(x, p))
    np.testing.assert_allclose(full, np.asarray(jax.jit(cpu_kernels.gemm_reference)(x, p)), rtol=1e-5, atol=1e-4)
    for rows in (1, 2, 3, 4, 5, 6, 7, 9, 16, 33):  # every row-block size of both kernels, and mixes of them
        np.testing.assert_array_equal(np.asarray(kernel(x[:rows], p)), full[:rows])


@needs_kernel
def test_the_two_gemms_give_the_same_bits(avx2_gemm_runs_here):
    """Both accumulate each output with one FMA per k in one order, so a machine's choice of kernel does not change
    a model's tokens."""
    rng = np.random.default_rng(7)
    p = cpu_kernels.pack_weight(rng.standard_normal((1536, 200)).astype(np.float32))
    x = (rng.standard_normal((12, 1536)) * rng.uniform(0.01, 100, (12, 1))).astype(np.float32)
    got = {s: np.asarray(jax.jit(functools.partial(gemm_kernel, target=t))(x, p)) for s, t in GEMMS.items()}
    np.testing.assert_array_equal(got["avx2"], got["avx512"])


def test_the_avx2_library_holds_no_avx512_instruction(avx2_gemm_runs_here):
    """It must load and run on CPUs without AVX-512: no instruction may use a zmm or mask register (EVEX)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump (binutils, installed with the compiler that builds the kernels) is not on PATH")
    text = subprocess.run([objdump, "-d", str(cpu_kernels.library.AVX2.library)], capture_output=True, text=True,
                          check=True).stdout
    assert "vfmadd" in text and "ymm" in text  # it is the AVX2 kernel
    # An AVX-512 instruction names a zmm register, a mask register or a vector register above 15, or (any of them,
    # also with ymm0-15 alone) starts with the EVEX prefix byte 0x62 (an instruction line: address, bytes, text).
    registers = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b")
    evex = [line for line in text.splitlines() if registers.search(line)
            or (len(fields := line.split("\t")) >= 3 and fields[1].split()[:1] == ["62"])]
    assert not evex, evex[:5]


def test_the_process_variable_selects_the_avx2_gemm(avx2_gemm_runs_here):
    """``JF_CPU_KERNELS=avx2``, read at start-up, makes the AVX2 GEMM the one that runs (and the AVX-512 set idle)."""
    code = "from cpu_kernels import bf16_gemm, library; print(bf16_gemm.kernel_target(), library.available())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "JF_CPU_KERNELS": "avx2"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["jf_bf16_gemm_avx2", "False"]


@pytest.mark.parametrize("kernel_set", list(GEMMS))
def test_packed_decode_view_keeps_the_model(kernel_set, monkeypatch):
    kernel_gate.apply(kernel_gate.this_machine(kernel_set))
    kernel_gate.use_only(monkeypatch, kernel_set)
    assert kernel_target() == GEMMS[kernel_set]
    cfg = MID.replace(dtype="bfloat16")
    params = cast_params(init_params(cfg, jax.random.PRNGKey(0)), cfg.compute_dtype)
    packed = decode_view(params, pack=True)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 24)).astype(np.int32)
    got, _ = jax.jit(lambda p, t: forward_logits(p, cfg, t))(packed, tokens)
    want, _ = jax.jit(lambda p, t: forward_logits(p, cfg, t))(params, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=0.1)
    back = stacked_params(packed, cfg)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), back, params))


def test_packing_refuses_column_shards():
    params = init_params(MID, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="not split in column shards"):
        decode_view(params, column_shards=2, pack=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_kernel_matches_its_jax_twin_and_is_batch_invariant(dtype):
    kernel_gate.apply(kernel_gate.this_machine("avx2"))
    rng = np.random.default_rng(3)
    dt = jnp.dtype(dtype)
    S, L, N = 160, 70, 12

    def arr(*shape):
        return jnp.asarray(rng.standard_normal(shape), dt)

    cache_k, cache_v = arr(1, S, 3, 64), arr(1, S, 3, 64)
    q, k, v = arr(1, N, 9, 64), arr(1, N, 3, 64), arr(1, N, 3, 64)
    lengths = jnp.asarray([L], jnp.int32)
    kernel = jax.jit(cpu_kernels.decode_attention)
    full = np.asarray(kernel(q, k, v, np.ones((1, N), bool), cache_k, cache_v, lengths))
    twin = jax.jit(lambda *a: cached_attention(*a, use_kernel=False))
    want = np.asarray(twin(q, k, v, np.ones((1, N), bool), cache_k, cache_v, lengths).astype(jnp.float32))
    np.testing.assert_allclose(full, want, rtol=1e-5 if dtype == "float32" else 2e-2,
                               atol=1e-5 if dtype == "float32" else 2e-2)
    # The first 5 tokens alone, then the other 7 over a cache that holds the first 5: the same bits.
    first = np.asarray(kernel(q[:, :5], k[:, :5], v[:, :5], np.ones((1, 5), bool), cache_k, cache_v, lengths))
    cache_k2 = cache_k.at[:, L:L + 5].set(k[:, :5])
    cache_v2 = cache_v.at[:, L:L + 5].set(v[:, :5])
    rest = np.asarray(kernel(q[:, 5:], k[:, 5:], v[:, 5:], np.ones((1, 7), bool), cache_k2, cache_v2, lengths + 5))
    np.testing.assert_array_equal(np.concatenate([first, rest], axis=1), full)
    # Beside two other rows sharing the cache row, with trailing padding: the same bits, zeros for padding.
    rows = lambda x: jnp.concatenate([x[:, ::-1], x, x[:, ::-1]])  # noqa: E731
    valid = np.ones((3, N), bool)
    valid[0, 8:] = False
    shared = np.asarray(kernel(rows(q), rows(k), rows(v), valid, cache_k, cache_v, lengths))
    np.testing.assert_array_equal(shared[1], full[0])
    assert not shared[0, 8:].any()
    # Two prompts of three rows each (the first prompt's cache row is the one above, the second another length):
    # rows read their own prompt's cache row, and the draft row keeps its bits.
    other_k, other_v = arr(1, S, 3, 64), arr(1, S, 3, 64)
    grouped = np.asarray(kernel(jnp.concatenate([rows(q)] * 2), jnp.concatenate([rows(k)] * 2),
                                jnp.concatenate([rows(v)] * 2), np.concatenate([valid] * 2),
                                jnp.concatenate([cache_k, other_k]), jnp.concatenate([cache_v, other_v]),
                                jnp.asarray([L, 33], jnp.int32)))
    np.testing.assert_array_equal(grouped[:3], shared)
    alone = np.asarray(kernel(rows(q), rows(k), rows(v), valid, other_k, other_v, jnp.asarray([33], jnp.int32)))
    np.testing.assert_array_equal(grouped[3:], alone)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_cache_write_kernel_gives_its_twins_bits(dtype):
    """``cpu_kernels.write_cache`` against ``kv_cache.write_rows``, starts clamped (and negative ones read) as
    ``lax.dynamic_update_slice`` does; ``KVCache.write`` runs the kernel where it runs and gives the same cache."""
    kernel_gate.apply(kernel_gate.this_machine("avx2"))
    rng = np.random.default_rng(5)
    dt = jnp.dtype(dtype)
    cache = jnp.asarray(rng.standard_normal((3, 2, 40, 3, 64)), dt)
    block = jnp.asarray(rng.standard_normal((3, 2, 8, 3, 64)), dt)
    kernel = jax.jit(cpu_kernels.write_cache)
    for lengths in ([0, 5], [33, 32], [-3, 100], [-60, -1]):
        lengths = jnp.asarray(lengths, jnp.int32)
        want = np.asarray(write_rows(cache, block, lengths))
        np.testing.assert_array_equal(np.asarray(kernel(cache, block, lengths)).view(np.uint8), want.view(np.uint8))
    kv = KVCache(k=cache, v=cache[::-1], lengths=jnp.asarray([7, 30], jnp.int32))
    write = jax.jit(KVCache.write)
    assert "jf_cache_write" in write.lower(kv, block, block).as_text()
    written = write(kv, block, block[::-1])
    np.testing.assert_array_equal(np.asarray(written.k), np.asarray(write_rows(kv.k, block, kv.lengths)))
    np.testing.assert_array_equal(np.asarray(written.v), np.asarray(write_rows(kv.v, block[::-1], kv.lengths)))
    with pytest.raises(ValueError, match="does not fit"):
        cpu_kernels.write_cache(cache, block[:, :1], lengths)


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("M", [1, 2, 7, 33])
def test_w8a8_kernel_gives_its_twins_bits(dtype, M):
    rng = np.random.default_rng(M)
    K, N = 96, 150  # N not a multiple of 16
    values = jnp.asarray(rng.integers(-127, 128, (K, N)), jnp.int8)
    packed = cpu_kernels.pack_int8(values, jnp.asarray(rng.uniform(1e-3, 1e-1, N), jnp.float32))
    np.testing.assert_array_equal(np.asarray(cpu_kernels.unpack_int8(packed)), np.asarray(values))
    x = rng.standard_normal((M, K)) * rng.uniform(0.1, 50, (M, 1))
    x[0, : K // 2] = np.round(x[0, : K // 2])  # values that quantise to exact halves: ties round to even
    if M > 2:
        x[2] = 0.0  # a zero row: scale 1, zeros out
    x = jnp.asarray(x, jnp.dtype(dtype))
    got = np.asarray(jax.jit(cpu_kernels.w8a8_matmul)(x, packed))
    want = np.asarray(jax.jit(cpu_kernels.w8a8_reference)(x, packed))
    np.testing.assert_array_equal(got, want)
    if M > 2:
        assert not got[2].any()
    np.testing.assert_array_equal(np.asarray(jax.jit(cpu_kernels.w8a8_matmul)(x[1:2], packed)), got[1:2])
