"""The TPU kernels' default tiles: legal for Mosaic at every length and head dim (``tuning.tpu_block_sizes``).

The compiled TPU kernel refuses a key tile that is neither a multiple of 128 lanes nor one tile over all keys;
its defaults once came from the device's row (64 x 64 on a CPU host or an unlisted TPU kind) and so refused an
88-token packing. Here: the rule on every length (pure arithmetic), ``jax.export`` for ``platforms=["tpu"]`` of
the forward and its gradient with the default tiles on the packed noise-conditioned layout at the issue's and
the 7B recipe's lengths, TPU interpret mode with the default tiles against the reference, and (with ``libtpu``)
the whole TPU compile, Mosaic's passes included, at lengths that are no multiple of 128.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from pallas_kernels.flash_attention import attention
from pallas_kernels.schedule import round_up
from pallas_kernels.tpu_attention import check_compiled_tiles, tile_sizes
from pallas_kernels.tuning import TILE_SIZES, TPU_LANES, BlockSizes, block_sizes_for, tpu_block_sizes
from tests.test_pallas_attention import Case, _inputs, _reference, meta_from_rows, packed_row
from tests.test_pallas_tpu import GENERATIONS, KERNEL_NAMES, _compile_for, _topology_device

# (prompt, blocks, n) of row 0 per length; row 1 packs half the prompt, so it ends in padding. 88 is the issue's
# packing (prompt 40, three blocks of 8, noisy + clean); 640 and 1024 the 7B recipe's class of lengths.
LAYOUTS = {88: (40, 3, 8), 100: (40, 3, 8), 128: (32, 3, 16), 200: (40, 5, 16), 640: (128, 16, 16),
           1024: (256, 16, 24)}
# (query heads, KV heads) per head dim: a small GQA at 64, Qwen2.5-7B's 28 over 4 at 128.
HEADS = {64: (4, 2), 128: (28, 4)}
# Every TPU row, an unlisted TPU kind and non-TPU hosts (lowering for a TPU from a CPU, interpret mode).
DEVICE_KINDS = ("TPU v4", "TPU v5 lite", "TPU v5", "TPU v5p", "TPU v6 lite", "TPU7x", "cpu", "NVIDIA H100 80GB HBM3")


def _packed_meta(length: int):
    prompt, blocks, n = LAYOUTS[length]
    return meta_from_rows([[packed_row(prompt, blocks, n)], [packed_row(prompt // 2, blocks, n)]], length)


def _arrays(length: int, head_dim: int, dtype):
    heads, kv_heads = HEADS[head_dim]
    meta = _packed_meta(length)
    array = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    return (array(2, length, heads, head_dim), array(2, length, kv_heads, head_dim),
            array(2, length, kv_heads, head_dim), meta, meta)


def _out(tiles: BlockSizes | None = None, *, interpret: bool = False):
    return lambda q, k, v, q_meta, k_meta: attention(q, k, v, q_meta, k_meta, block_sizes=tiles,
                                                     interpret=interpret, backend="tpu")


def _grad(tiles: BlockSizes | None = None):
    loss = lambda *args: jnp.sum(_out(tiles)(*args).astype(jnp.float32) ** 2)  # noqa: E731
    return jax.grad(loss, argnums=(0, 1, 2))


class TestDefaultTileRule:
    @pytest.mark.parametrize("kind", DEVICE_KINDS)
    def test_default_tiles_are_legal_at_every_length(self, kind):
        # The defaults shrunk to each length as the kernels shrink them, through the compiled kernel's own check.
        tiles = tpu_block_sizes(kind)
        assert tiles.block_k % TPU_LANES == 0 and tiles.block_q % 8 == 0
        for length in range(1, 4097):
            block_q, block_k = tile_sizes(tiles.block_q, tiles.block_k, length, length)
            check_compiled_tiles(block_q, block_k, round_up(length, block_k))
            assert round_up(length, block_q) >= length

    def test_rows(self):
        # TPU kinds keep their rows (v6e's 256 x 256); unlisted TPUs and non-TPU hosts take the generic TPU row.
        for kind in ("TPU v4", "TPU v5 lite", "TPU v5", "TPU v6 lite"):
            assert tpu_block_sizes(kind) == block_sizes_for(kind) != TILE_SIZES["default"], kind
        assert block_sizes_for("TPU7x") is TILE_SIZES["TPU"]
        for kind in ("TPU7x", "cpu", "NVIDIA H100 80GB HBM3"):
            assert tpu_block_sizes(kind) == TILE_SIZES["TPU"], kind
        # A row with a narrower key tile is raised to the lanes; its query tile is kept.
        table = {"TPU": BlockSizes(block_q=64, block_k=32), "default": BlockSizes(block_q=16, block_k=16)}
        assert tpu_block_sizes("TPU v9", table) == BlockSizes(block_q=64, block_k=TPU_LANES)

    def test_explicit_tiles_are_still_checked(self):
        with pytest.raises(ValueError, match="block_k must be a multiple of 128 .* all 128 keys, got 64"):
            export.export(jax.jit(_out(BlockSizes(block_q=64, block_k=64))), platforms=["tpu"])(
                *_arrays(88, 64, jnp.bfloat16))


class TestDefaultTilesExportForTpu:
    @pytest.mark.parametrize("head_dim", sorted(HEADS))
    @pytest.mark.parametrize("length", sorted(LAYOUTS))
    def test_forward_and_gradient_export(self, length, head_dim):
        args = _arrays(length, head_dim, jnp.bfloat16)
        forward = export.export(jax.jit(_out()), platforms=["tpu"])(*args).mlir_module()
        assert "tpu_custom_call" in forward and KERNEL_NAMES[0] in forward
        gradient = export.export(jax.jit(_grad()), platforms=["tpu"])(*args).mlir_module()
        for name in KERNEL_NAMES:
            assert name in gradient, name

    def test_float32_exports_at_the_issue_length(self):
        export.export(jax.jit(_grad()), platforms=["tpu"])(*_arrays(88, 128, jnp.float32))


@pytest.mark.slow
class TestDefaultTilesInterpret:
    """TPU interpret mode with the default tiles (the same ones the compiled kernel takes on this host) against
    the reference: 88 tokens (one tile each way) and 200 (2 x 2 tiles, the last half padding). 2-4 s each."""

    @pytest.mark.parametrize("length", [88, 200])
    def test_forward_and_gradients_match_the_reference(self, length):
        meta = _packed_meta(length)
        case = Case(meta, meta, 4, 2, 32, tpu_block_sizes())
        q, k, v = _inputs(case, jnp.float32, seed=11)
        d_out = jnp.asarray(np.random.default_rng(12).standard_normal(q.shape, np.float32))
        kernel = lambda *x: attention(*x, meta, meta, interpret=True, backend="tpu")  # noqa: E731
        out, vjp = jax.vjp(kernel, q, k, v)
        ref_out, ref_vjp = jax.vjp(lambda *x: _reference(case, *x), q, k, v)
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
        padded = np.asarray(meta.segment) < 0
        assert padded.any() and not np.any(np.asarray(out)[padded])
        for got, want in zip(vjp(d_out), ref_vjp(d_out)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class TestDefaultTilesCompile:
    """With libtpu (skipped without it): the whole TPU compile of the gradient with each generation's default
    tiles at lengths that are no multiple of 128, 7B heads."""

    @pytest.mark.parametrize("generation", sorted(GENERATIONS))
    def test_gradient_compiles_at_unaligned_lengths(self, generation):
        device = _topology_device(generation)
        sharding = jax.sharding.SingleDeviceSharding(device)
        tiles = tpu_block_sizes(device.device_kind)
        for length in (88, 200):
            q, k, v, q_meta, k_meta = _arrays(length, 128, jnp.bfloat16)
            specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding) for x in (q, k, v)]
            meta = [jax.tree.map(lambda f: jax.ShapeDtypeStruct(f.shape, f.dtype, sharding=sharding), m)
                    for m in (q_meta, k_meta)]
            compiled = _compile_for(device, _grad(tiles), [*specs, *meta])
            assert all(name in compiled.as_text() for name in KERNEL_NAMES)
