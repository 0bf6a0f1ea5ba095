"""The flash-attention kernels against the plain-JAX reference: one shared battery, one subclass per backend.

``AttentionBattery`` holds every check. ``TestPallasInterpret`` runs the Triton kernels (forward and fused backward)
in Pallas interpret mode on CPU and ``TestPallasGPU`` compiles them with Triton (skipped without a GPU);
``TestTpuInterpret`` runs the TPU (Mosaic) kernels and their fused backward in TPU interpret mode on CPU and
``TestPallasTPU`` compiles them (skipped without a TPU). Shapes are small because interpret mode runs the kernels'
grids step by step on the host (the TPU interpret mode simulates every grid step's copies: tens of milliseconds a
step). Mask layouts are built here independently of the trainer. The Triton kernels lowered for CUDA on any host,
and the Triton backward's memory: ``TestTritonLowering``, ``TestBackwardMemory``. Lowering and compiling for TPUs
from a CPU host: tests/test_pallas_tpu.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from pallas_kernels import attention_reference
from pallas_kernels.flash_attention import attention, tile_sparsity, tile_visit_mask
from pallas_kernels.mask import (MASK_CLEAN_CONTEXT, MASK_NOISE_CONDITIONED, STREAM_CLEAN, STREAM_NOISY,
                                 TokenMeta, dense_mask)
from pallas_kernels.tuning import BlockSizes, block_sizes_for

# ---- per-token layouts (numpy rows of (position, segment, stream, block)) --------------------------------


def causal_row(length: int, segment: int = 0):
    return np.arange(length), np.full(length, segment), np.zeros(length, int), np.full(length, -1)


def packed_row(prompt: int, num_blocks: int, n: int, segment: int = 0):
    """[prompt, noisy_0, clean_0, noisy_1, clean_1, ...]; both copies of block j at positions P + j*n + i."""
    pos, stream, block = list(range(prompt)), [0] * prompt, [-1] * prompt
    for j in range(num_blocks):
        for s in (STREAM_NOISY, STREAM_CLEAN):
            pos += [prompt + j * n + i for i in range(n)]
            stream += [s] * n
            block += [j] * n
    return np.array(pos), np.full(len(pos), segment), np.array(stream), np.array(block)


def meta_from_rows(rows, length: int) -> TokenMeta:
    """Stacks rows (each a list of pieces concatenated in order), padding each to ``length`` (segment -1)."""
    fields = []
    for pieces in rows:
        row = [np.concatenate([p[i] for p in pieces]) for i in range(4)]
        pad = length - len(row[0])
        fields.append([np.pad(f, (0, pad), constant_values=c) for f, c in zip(row, (0, -1, 0, -1))])
    return TokenMeta(*(jnp.asarray(np.stack([r[i] for r in fields]), jnp.int32) for i in range(4)))


def decode_meta(lengths, capacity: int, block: int, padded_queries=None):
    """A Jacobi draft block of ``block`` tokens after a cache of ``capacity`` slots with valid ``lengths``;
    the last ``padded_queries[b]`` queries of row b are padding."""
    lengths = np.asarray(lengths)
    padded_queries = np.zeros(len(lengths), int) if padded_queries is None else padded_queries
    slots = np.broadcast_to(np.arange(capacity), (len(lengths), capacity))
    q_pos = lengths[:, None] + np.arange(block)
    q_seg = np.where(np.arange(block)[None] < block - np.asarray(padded_queries)[:, None], 0, -1)
    zeros = lambda x: np.zeros_like(x)  # noqa: E731
    q = TokenMeta(q_pos, q_seg, zeros(q_pos), zeros(q_pos) - 1)
    k = TokenMeta(*(np.concatenate([a, b], axis=1) for a, b in
                    zip((slots, np.where(slots < lengths[:, None], 0, -1), zeros(slots), zeros(slots) - 1), q)))
    as_jnp = lambda m: TokenMeta(*(jnp.asarray(f, jnp.int32) for f in m))  # noqa: E731
    return as_jnp(q), as_jnp(k)


@dataclasses.dataclass(frozen=True)
class Case:
    q_meta: TokenMeta
    k_meta: TokenMeta
    heads: int
    kv_heads: int
    head_dim: int
    tiles: BlockSizes
    mask_kind: str = MASK_NOISE_CONDITIONED


def _cases():
    # Metadata is runtime data, so cases sharing shapes, tiles and mask kind share one compiled kernel:
    # causal, packed and multi-segment all use [2, 55] tokens (interpret-mode compiles dominate test time).
    causal = meta_from_rows([[causal_row(55)], [causal_row(37)]], 55)  # row 1 ends in 18 padding queries
    packed = meta_from_rows([[packed_row(7, 3, 8)], [packed_row(4, 3, 8)]], 55)
    segments = meta_from_rows([[causal_row(20, 0), packed_row(3, 2, 6, 1)],
                               [packed_row(5, 2, 5, 0), causal_row(25, 1)]], 55)
    dq, dk = decode_meta([13, 29], capacity=40, block=16, padded_queries=(0, 3))
    tiles = BlockSizes(block_q=16, block_k=16)
    return {
        "causal": Case(causal, causal, 4, 2, 32, tiles),
        "packed_noise_conditioned": Case(packed, packed, 4, 2, 32, tiles),
        "multi_segment": Case(segments, segments, 4, 2, 32, tiles),
        # Multi-head (no grouping), a head dim that is not a power of two, and unequal tiles.
        "packed_clean_context": Case(packed, packed, 2, 2, 24, BlockSizes(block_q=32, block_k=16),
                                     MASK_CLEAN_CONTEXT),
        # Multi-query: 16 draft queries over 40 cache slots + themselves (56 keys, not a multiple of 16).
        "jacobi_decode": Case(dq, dk, 4, 1, 16, tiles),
    }


CASES = _cases()


def _inputs(case: Case, dtype, seed: int = 0):
    B, T = case.q_meta.position.shape
    S = case.k_meta.position.shape[1]
    # numpy draws: jax.random compiles a threefry kernel per shape, which costs seconds on a small CPU.
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, case.heads, case.head_dim), np.float32)
    k = rng.standard_normal((B, S, case.kv_heads, case.head_dim), np.float32)
    v = rng.standard_normal((B, S, case.kv_heads, case.head_dim), np.float32)
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


_jit_reference = jax.jit(attention_reference, static_argnames=("mask_kind", "scale", "precision"))


def _reference(case: Case, q, k, v):
    # Full-precision dots, named on the dots themselves (so the backward, traced later, keeps them too): the GPU
    # reference must not use TF32 while the kernel asks for IEEE.
    return _jit_reference(q, k, v, case.q_meta, case.k_meta, mask_kind=case.mask_kind,
                          precision=jax.lax.Precision.HIGHEST)


def _poisoned_decode_case():
    """Cache slots 14..39 are dead in both rows (lengths 5 and 14); slots 16..31 fill key tile 1, which no query
    tile visits. NaN there would poison any tile that read it (0 * NaN = NaN), so exact results show a kernel
    neither loads nor computes skipped tiles. (Same shapes as "jacobi_decode".)"""
    q_meta, k_meta = decode_meta([5, 14], capacity=40, block=16)
    case = dataclasses.replace(CASES["jacobi_decode"], q_meta=q_meta, k_meta=k_meta)
    q, k, v = _inputs(case, jnp.float32)
    dead = (np.arange(k.shape[1]) >= 16) & (np.arange(k.shape[1]) < 32)
    assert not np.any(np.asarray(k_meta.segment)[:, dead] >= 0)
    poison = lambda x: jnp.where(dead[None, :, None, None], jnp.nan, x)  # noqa: E731
    return case, q, k, v, dead, poison


class AttentionBattery:
    """Every kernel check; subclasses choose the kernel (BACKEND) and interpret mode or the device (INTERPRET)."""

    INTERPRET: bool = True
    BACKEND: str = "triton"
    DEVICE: str = "gpu"  # the JAX backend the compiled subclass needs
    ATTENTION_IMPL: str = "pallas_triton"  # the ModelConfig switch that selects this kernel

    def setup_method(self, method):
        if not self.INTERPRET and jax.default_backend() != self.DEVICE:
            pytest.skip(f"no {self.DEVICE.upper()} (default backend {jax.default_backend()!r}); the interpret "
                        f"subclass covers CPU")

    def kernel(self, case: Case, q, k, v):
        return attention(q, k, v, case.q_meta, case.k_meta, mask_kind=case.mask_kind, block_sizes=case.tiles,
                         interpret=self.INTERPRET, backend=self.BACKEND)

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_forward_float32(self, name):
        case = CASES[name]
        q, k, v = _inputs(case, jnp.float32)
        out = self.kernel(case, q, k, v)
        assert out.shape == q.shape and out.dtype == jnp.float32
        np.testing.assert_allclose(out, _reference(case, q, k, v), rtol=1e-5, atol=1e-5)

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_forward_bfloat16(self, name):
        case = CASES[name]
        q, k, v = _inputs(case, jnp.bfloat16)
        out = self.kernel(case, q, k, v)
        assert out.dtype == jnp.bfloat16
        # Compared with the float32 reference on the same bf16-rounded inputs: bf16 output rounding (2^-8
        # relative) plus bf16 probabilities in the PV product.
        expected = _reference(case, *(x.astype(jnp.float32) for x in (q, k, v)))
        np.testing.assert_allclose(out.astype(jnp.float32), expected, rtol=2e-2, atol=2e-2)

    @pytest.mark.parametrize("name", ["jacobi_decode", "multi_segment", "packed_clean_context"])
    def test_gradients_float32(self, name):
        case = CASES[name]
        q, k, v = _inputs(case, jnp.float32, seed=1)
        d_out = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape, np.float32))
        out, vjp = jax.vjp(lambda *x: self.kernel(case, *x), q, k, v)
        ref_out, ref_vjp = jax.vjp(lambda *x: _reference(case, *x), q, k, v)
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
        for got, want in zip(vjp(d_out), ref_vjp(d_out)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def test_gradients_bfloat16(self):
        case = CASES["packed_noise_conditioned"]
        q, k, v = _inputs(case, jnp.bfloat16, seed=5)
        d_out = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape, np.float32), jnp.bfloat16)
        got = jax.vjp(lambda *x: self.kernel(case, *x), q, k, v)[1](d_out)
        up = lambda x: x.astype(jnp.float32)  # noqa: E731
        want = jax.vjp(lambda *x: _reference(case, *x), *map(up, (q, k, v)))[1](up(d_out))
        for g, w in zip(got, want):
            assert g.dtype == jnp.bfloat16
            # bf16 probabilities and dS in the backward's dots, bf16 outputs: about 2^-8 relative per term.
            np.testing.assert_allclose(up(g), w, rtol=5e-2, atol=5e-2)

    def test_gradients_match_finite_differences(self):
        # Against the definition of the derivative, not against the reference's autodiff: central differences
        # along random directions on a tiny float32 packed case (2 query and 2 key tiles, GQA). eps and the
        # tolerances are float32's: a difference quotient with eps 1e-2 is good to about 1e-3 here.
        meta = meta_from_rows([[packed_row(4, 2, 6)]], 28)
        case = Case(meta, meta, 2, 1, 8, BlockSizes(block_q=16, block_k=16))
        q, k, v = _inputs(case, jnp.float32, seed=7)
        check_grads(lambda *x: self.kernel(case, *x), (q, k, v), order=1, modes=["rev"],
                                  eps=1e-2, atol=2e-2, rtol=2e-2)

    def test_backward_never_reads_skipped_tiles(self):
        case, q, k, v, dead, poison = _poisoned_decode_case()
        d_out = jnp.asarray(np.random.default_rng(8).standard_normal(q.shape, np.float32))
        got = jax.vjp(lambda *x: self.kernel(case, *x), q, poison(k), poison(v))[1](d_out)
        want = jax.vjp(lambda *x: _reference(case, *x), q, k, v)[1](d_out)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        assert not np.any(np.asarray(got[1])[:, dead]) and not np.any(np.asarray(got[2])[:, dead])

    def test_float32_gradients_ignore_the_global_matmul_precision(self):
        # The backward asks for full-precision dots itself: a TF32 default (JAX's on an Ampere-or-later GPU, which
        # put 2.6e-3 into these gradients on an H100) must not reach it.
        case = CASES["jacobi_decode"]
        q, k, v = _inputs(case, jnp.float32, seed=3)
        d_out = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape, np.float32))
        with jax.default_matmul_precision("tensorfloat32"):
            got = jax.vjp(lambda *x: self.kernel(case, *x), q, k, v)[1](d_out)
        want = jax.vjp(lambda *x: _reference(case, *x), q, k, v)[1](d_out)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

    def test_fully_masked_rows_are_zero(self):
        case = CASES["jacobi_decode"]
        q, k, v = _inputs(case, jnp.float32)
        out = np.asarray(self.kernel(case, q, k, v))
        padded = np.asarray(case.q_meta.segment) < 0
        assert padded.sum() == 3
        np.testing.assert_array_equal(out[padded], 0.0)
        assert np.all(np.abs(out[~padded]).sum(-1) > 0)

    def test_skipped_tiles_are_never_read(self):
        case, q, k, v, dead, poison = _poisoned_decode_case()
        out = self.kernel(case, q, poison(k), poison(v))
        np.testing.assert_allclose(out, _reference(case, q, k, v), rtol=1e-5, atol=1e-5)

    def test_model_forward_matches_reference(self):
        # The config switch: the whole decoder with the kernel equals the reference, with and without a cache.
        from jf_jax.model.config import ModelConfig
        from jf_jax.model.kv_cache import KVCache
        from jf_jax.model.transformer import forward
        from jf_jax.model.params import abstract_params

        cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=128, attention_bias=True, tie_word_embeddings=True)
        kernel_cfg = cfg.replace(attention_impl=self.ATTENTION_IMPL)
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype),
                              abstract_params(cfg))
        tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 21)), jnp.int32)
        run = jax.jit(forward, static_argnums=1)
        with jax.default_matmul_precision("float32"):
            hidden, _ = run(params, kernel_cfg, tokens)
            expected, _ = run(params, cfg, tokens)
        np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)

        # A 5-token draft block over a cache holding random keys/values, with different valid lengths per row.
        shape = KVCache.shape(cfg, 2, 32)
        cache = KVCache(k=jnp.asarray(rng.standard_normal(shape), jnp.float32),
                        v=jnp.asarray(rng.standard_normal(shape), jnp.float32), lengths=jnp.array([21, 12], jnp.int32))
        with jax.default_matmul_precision("float32"):
            hidden, new_cache = run(params, kernel_cfg, tokens[:, :5], cache=cache)
            expected, expected_cache = run(params, cfg, tokens[:, :5], cache=cache)
        np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(new_cache.k, expected_cache.k, rtol=1e-5, atol=1e-5)


class TestPallasInterpret(AttentionBattery):
    INTERPRET = True


@pytest.mark.gpu
class TestPallasGPU(AttentionBattery):
    INTERPRET = False


class TestTpuInterpret(AttentionBattery):
    INTERPRET = True
    BACKEND = "tpu"
    ATTENTION_IMPL = "pallas_tpu"


class TestPallasTPU(AttentionBattery):
    INTERPRET = False
    BACKEND = "tpu"
    DEVICE = "tpu"
    ATTENTION_IMPL = "pallas_tpu"


_visit_mask = jax.jit(tile_visit_mask, static_argnums=(2, 3, 4))
_sparsity = jax.jit(tile_sparsity, static_argnames=("block_q", "block_k", "mask_kind"))


def _needed_tiles(q_meta, k_meta, block_q, block_k, mask_kind):
    """Independent ground truth: the dense mask reduced per tile (does any pair of the two tiles attend?)."""
    mask = np.asarray(dense_mask(q_meta, k_meta, mask_kind))
    B, T, S = mask.shape
    mask = np.pad(mask, ((0, 0), (0, -T % block_q), (0, -S % block_k)))
    return mask.reshape(B, mask.shape[1] // block_q, block_q, -1, block_k).any(axis=(2, 4))


class TestTileSchedule:
    """The tile-skipping decisions (plain JAX: no kernel runs here)."""

    @pytest.mark.parametrize("tiles", [(16, 16), (32, 32), (32, 16), (64, 64)])
    def test_packed_layout_skips_exactly_the_masked_tiles(self, tiles):
        meta = meta_from_rows([[packed_row(32, 4, 16)]], 160)
        needed = _needed_tiles(meta, meta, *tiles, MASK_NOISE_CONDITIONED)
        if 160 % tiles[0] == 0 and 160 % tiles[1] == 0:
            np.testing.assert_array_equal(_visit_mask(meta, meta, *tiles, MASK_NOISE_CONDITIONED), needed)
        sparsity = float(_sparsity(meta, meta, block_q=tiles[0], block_k=tiles[1]))
        assert sparsity == pytest.approx(1.0 - needed.mean())

    def test_packed_layout_sparsity_closed_form(self):
        # P=32 and 4 blocks of 16 in tiles of 16: 10x10 tile pairs. Prompt tiles visit 1 and 2 tiles; the noisy
        # and the clean tile of block j each visit the 2 prompt tiles and j+1 tiles of their own stream.
        meta = meta_from_rows([[packed_row(32, 4, 16)]], 160)
        visited = 1 + 2 + 2 * sum(2 + j + 1 for j in range(4))
        assert float(_sparsity(meta, meta, block_q=16, block_k=16)) == pytest.approx(1 - visited / 100)

    @pytest.mark.parametrize("mask_kind", [MASK_NOISE_CONDITIONED, MASK_CLEAN_CONTEXT])
    def test_never_skips_a_needed_tile_on_random_metadata(self, mask_kind):
        rng = np.random.default_rng(0)
        for _ in range(2):
            B, T, S = 16, 48, 64
            draw = lambda n: TokenMeta(jnp.asarray(rng.integers(0, 40, (B, n)), jnp.int32),  # noqa: E731
                                       jnp.asarray(rng.integers(-1, 2, (B, n)), jnp.int32),
                                       jnp.asarray(rng.integers(0, 3, (B, n)), jnp.int32),
                                       jnp.asarray(rng.integers(-1, 4, (B, n)), jnp.int32))
            q_meta, k_meta = draw(T), draw(S)
            visit = np.asarray(_visit_mask(q_meta, k_meta, 16, 16, mask_kind))
            needed = _needed_tiles(q_meta, k_meta, 16, 16, mask_kind)
            assert not np.any(needed & ~visit)

    def test_dead_cache_tiles_are_skipped(self):
        q_meta, k_meta = decode_meta([13, 40], capacity=64, block=16)
        visit = np.asarray(_visit_mask(q_meta, k_meta, 16, 16, MASK_NOISE_CONDITIONED))
        np.testing.assert_array_equal(visit[:, 0], [[1, 0, 0, 0, 1], [1, 1, 1, 0, 1]])


class TestTritonLowering:
    """Lowers the compiled (non-interpret) kernels, forward and fused backward, to Triton IR on any host via
    jax.export: catches GPU-only lowering errors (a tensor shape Triton cannot hold, a primitive without a Triton
    rule) without a GPU. Compiling the IR to PTX (registers, shared memory) still needs one: TestPallasGPU and
    TestBackwardMemory.test_compiled_on_gpu."""

    @pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
    @pytest.mark.parametrize("name", ["jacobi_decode", "packed_clean_context"])  # GQA; unequal tiles, head dim 24
    def test_exports_for_cuda(self, name, dtype):
        from jax import export

        case = CASES[name]
        q, k, v = (jax.ShapeDtypeStruct(x.shape, dtype) for x in _inputs(case, jnp.float32))
        kernel = lambda q, k, v: attention(q, k, v, case.q_meta, case.k_meta, mask_kind=case.mask_kind,  # noqa: E731
                                           block_sizes=case.tiles, interpret=False, backend="triton")
        loss = lambda *x: jnp.sum(kernel(*x).astype(jnp.float32) ** 2)  # noqa: E731
        # The forward is one Triton kernel; its gradient runs three (forward, dq, dk/dv) and no reference.
        for fn, kernels in ((kernel, 1), (jax.grad(loss, argnums=(0, 1, 2)), 3)):
            exported = export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=[
                export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(q, k, v)
            assert exported.mlir_module().count("@__gpu$xla.gpu.triton") == kernels


class TestBackwardMemory:
    """The Triton path's gradient: compiled temporary memory at T, 2T and 4T tokens (S = T; batch 1, 2 query heads
    over 1 KV head). The growth is read from the increments, so that the constant part of a program's temporaries
    (which dominated the ratio at T = 1024 on an H100: 6.5x from T to 4T for the reference) does not hide it: the
    increment from 2T to 4T over the one from T to 2T is 2 when the backward is O(T) (the fused kernels) and
    approaches 4 when it holds the T x S probabilities (``backward="reference"``, the reference's autodiff behind
    the same forward)."""

    @staticmethod
    def _growth(T: int, dtype, head_dim: int, tiles: BlockSizes, interpret: bool, backward: str) -> float:
        def temp_bytes(n):
            meta = TokenMeta(*[jax.ShapeDtypeStruct((1, n), jnp.int32)] * 4)
            array = lambda heads: jax.ShapeDtypeStruct((1, n, heads, head_dim), dtype)  # noqa: E731
            loss = lambda q, k, v, m: jnp.sum(attention(  # noqa: E731
                q, k, v, m, m, block_sizes=tiles, interpret=interpret, backend="triton",
                backward=backward).astype(jnp.float32) ** 2)
            compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(array(2), array(1), array(1), meta).compile()
            return compiled.memory_analysis().temp_size_in_bytes
        one, two, four = (temp_bytes(m * T) for m in (1, 2, 4))
        return (four - two) / (two - one)

    def test_interpreted_on_cpu(self):
        # The CPU program of the interpret mode: its temporaries are the kernels' operands and block copies.
        tiles = BlockSizes(block_q=64, block_k=64)
        fused, reference = (self._growth(256, jnp.float32, 16, tiles, True, b) for b in ("fused", "reference"))
        assert fused < 2.6 and reference > 3.2, (fused, reference)

    @pytest.mark.gpu
    def test_compiled_on_gpu(self):
        # Compiles the Triton backward for real (PTX, the device's tiles, bf16 at head dim 128) and measures it.
        if jax.default_backend() != "gpu":
            pytest.skip(f"no GPU (default backend {jax.default_backend()!r}); TestTritonLowering lowers the "
                        f"backward for CUDA on any host, and the interpret battery checks its numerics")
        tiles = block_sizes_for()
        fused, reference = (self._growth(1024, jnp.bfloat16, 128, tiles, False, b) for b in ("fused", "reference"))
        assert fused < 2.6 and reference > 3.2, (fused, reference)


class TestApi:
    def test_tile_sizes_lookup(self):
        from pallas_kernels.tuning import TILE_SIZES

        assert block_sizes_for("NVIDIA H100 80GB HBM3") == TILE_SIZES["H100"]
        assert block_sizes_for("NVIDIA H200") == TILE_SIZES["H200"]
        assert block_sizes_for("NVIDIA A100-SXM4-80GB") == TILE_SIZES["A100"]
        # TPU generations by the device kinds they report; v5e ("TPU v5 lite") must not take v5p's ("TPU v5") row.
        for kind, key in (("TPU v4", "TPU v4"), ("TPU v5 lite", "TPU v5 lite"), ("TPU v5", "TPU v5"),
                          ("TPU v5p", "TPU v5"), ("TPU v6 lite", "TPU v6")):
            assert block_sizes_for(kind) is TILE_SIZES[key], kind
        assert block_sizes_for("some new accelerator") == TILE_SIZES["default"]
        with pytest.raises(ValueError, match="power of two"):
            BlockSizes(block_q=48, block_k=16)

    def test_bad_inputs_raise_with_shapes(self):
        case = CASES["causal"]
        q, k, v = _inputs(case, jnp.float32)
        with pytest.raises(ValueError, match="dtypes differ"):
            attention(q, k.astype(jnp.bfloat16), v, case.q_meta, case.k_meta)
        with pytest.raises(ValueError, match=r"\(2, 55, 4, 32\) and k \(1, 55, 2, 32\)"):
            attention(q, k[:1], v[:1], case.q_meta, case.k_meta)
        with pytest.raises(ValueError, match="mask kind"):
            attention(q, k, v, case.q_meta, case.k_meta, mask_kind="full")
        with pytest.raises(ValueError, match="unknown backend"):
            attention(q, k, v, case.q_meta, case.k_meta, backend="mosaic_gpu")
        with pytest.raises(ValueError, match="unknown backward"):
            attention(q, k, v, case.q_meta, case.k_meta, backward="autodiff")

    def test_reference_backward_is_the_fallback(self):
        # backward="reference" differentiates the reference behind the kernel's forward: the fused backward's
        # semantics, selectable should a fused backward fail to compile on some device.
        case = CASES["jacobi_decode"]
        q, k, v = _inputs(case, jnp.float32, seed=1)
        grad = lambda backward: jax.grad(lambda *x: jnp.sum(attention(  # noqa: E731
            *x, case.q_meta, case.k_meta, block_sizes=case.tiles, backend="triton", backward=backward) ** 2),
            argnums=(0, 1, 2))(q, k, v)
        for fused, reference in zip(grad("fused"), grad("reference")):
            np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-5)
