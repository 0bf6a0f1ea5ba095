"""The TPU (Mosaic) attention kernels lowered and compiled for TPUs from a CPU host, and their memory.

Three levels, from cheapest to most complete (the numerics are the battery's, tests/test_pallas_attention.py):

* **Export** (always runs): ``jax.export`` for ``platforms=["tpu"]`` runs Pallas's lowering of each kernel to a
  Mosaic module, index maps and scalar prefetch included, and serialises it into a ``tpu_custom_call``. It
  catches what JAX checks (block shapes, primitives without a Mosaic rule), not Mosaic's own passes (vector
  layouts, VMEM), which run inside libtpu.
* **Compile** (when the ``libtpu`` package is installed; no TPU needed): ``jax.experimental.topologies`` describes
  a TPU slice, and ``jit(...).trace(...).lower(lowering_platforms=("tpu",)).compile()`` runs the whole
  TPU compiler on this host, Mosaic included, for each generation's tiles in ``tuning.TILE_SIZES``. A kernel
  that exports but does not compile (an unsupported reshape, too much VMEM) fails here. libtpu also warns on
  stderr that it found no TPU; ``jax.default_backend()`` stays "cpu".
* **Memory**: the backward's compiled temporary memory at two lengths. It grows linearly for the fused backward
  and quadratically for the reference's autodiff (the T x S probabilities), measured by XLA's memory analysis
  of the CPU program in TPU interpret mode (whose buffers are those of the kernels' operands) and, with
  libtpu, of the TPU program itself.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import pytest
from jax import export

from pallas_kernels import attention_reference
from pallas_kernels.flash_attention import attention
from pallas_kernels.mask import TokenMeta
from pallas_kernels.tuning import TILE_SIZES, BlockSizes, block_sizes_for

KERNEL_NAMES = ("jf_flash_attention_tpu", "jf_flash_attention_tpu_dq", "jf_flash_attention_tpu_dkv")
# (topology, device kind it reports): one small slice per generation. v5p reports "TPU v5".
GENERATIONS = {"v4": ("v4:2x2x1", "TPU v4"), "v5e": ("v5e:2x2", "TPU v5 lite"), "v5p": ("v5p:2x2x1", "TPU v5"),
               "v6e": ("v6e:2x2", "TPU v6 lite")}


def _specs(B, T, S, H, K, D, dtype, sharding=None):
    array = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)  # noqa: E731
    meta = lambda n: TokenMeta(*[array(B, n, dt=jnp.int32)] * 4)  # noqa: E731
    return array(B, T, H, D), array(B, S, K, D), array(B, S, K, D), meta(T), meta(S)


def _loss(tiles: BlockSizes | None, *, interpret: bool = False):
    """Sum of squares of the kernel's output (None: of the reference's), a scalar whose gradient runs the backward."""
    def loss(q, k, v, q_meta, k_meta):
        if tiles is None:
            out = attention_reference(q, k, v, q_meta, k_meta)
        else:
            out = attention(q, k, v, q_meta, k_meta, block_sizes=tiles, interpret=interpret, backend="tpu")
        return jnp.sum(out.astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=(0, 1, 2))


class TestTpuExport:
    @pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
    def test_forward_and_backward_export_for_tpu(self, dtype):
        # 300 tokens in 128-token tiles: 3 x 3 tiles with padding; 4 query heads over 2 KV heads; head dim 64.
        specs = _specs(2, 300, 300, 4, 2, 64, dtype)
        exported = export.export(jax.jit(_loss(BlockSizes(block_q=128, block_k=128))), platforms=["tpu"])(*specs)
        module = exported.mlir_module()
        assert "tpu_custom_call" in module
        for name in KERNEL_NAMES:
            assert name in module, name

    def test_compiled_tiles_must_suit_the_lanes(self):
        # Key data rides on lanes: a compiled key tile is a multiple of 128 or covers every key.
        specs = _specs(1, 300, 300, 2, 1, 64, jnp.bfloat16)
        with pytest.raises(ValueError, match="block_k must be a multiple of 128"):
            export.export(jax.jit(_loss(BlockSizes(block_q=128, block_k=64))), platforms=["tpu"])(*specs)

    def test_model_train_step_exports_for_tpu(self, monkeypatch):
        # The train step as a TPU host traces it: with the default backend reported as "tpu", attention_impl
        # "auto" selects the compiled TPU kernel (not interpret mode), and the whole step lowers for a TPU.
        import functools

        from jf_jax.training.losses import LossConfig
        from jf_jax.training.state import OptimConfig, init_state, make_optimizer
        from jf_jax.training.step import train_step
        from tests.support.train_models import TINY, numpy_params, synthetic_batch

        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
        cfg, ocfg = TINY.replace(attention_impl="auto"), OptimConfig()
        optimizer = make_optimizer(cfg, ocfg, 10)
        state = jax.eval_shape(lambda p: init_state(p, optimizer), numpy_params(cfg))
        batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in synthetic_batch(cfg.vocab_size, 2, 64).items()}
        step = functools.partial(train_step, cfg=cfg, lcfg=LossConfig(), ocfg=ocfg, optimizer=optimizer,
                                 total_steps=10)
        module = export.export(jax.jit(step), platforms=["tpu"])(state, batch).mlir_module()
        for name in KERNEL_NAMES:
            assert name in module, name


def _topology_device(generation: str):
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'libtpu==0.0.42.*', jax 0.10.2's): no TPU compiler")
    from jax.experimental import topologies

    topology, kind = GENERATIONS[generation]
    device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
    assert device.device_kind == kind
    return device


def _compile_for(device, fn, specs):
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("tpu",)).compile()


class TestTpuCompile:
    @pytest.mark.parametrize("generation", sorted(GENERATIONS))
    def test_each_generation_compiles_its_tiles(self, generation):
        # The training shape class: bf16, head dim 128, 4 query heads per KV head, a length that pads.
        device = _topology_device(generation)
        tiles = block_sizes_for(device.device_kind)
        assert tiles is not TILE_SIZES["default"]
        specs = _specs(1, 640, 640, 8, 2, 128, jnp.bfloat16, jax.sharding.SingleDeviceSharding(device))
        compiled = _compile_for(device, _loss(tiles), specs)
        assert all(name in compiled.as_text() for name in KERNEL_NAMES)

    def test_float32_and_odd_head_dim_compile(self):
        # float32 runs its dots at HIGHEST precision (several MXU passes); head dim 24 is not lane-aligned.
        device = _topology_device("v5e")
        specs = _specs(2, 300, 300, 2, 2, 24, jnp.float32, jax.sharding.SingleDeviceSharding(device))
        _compile_for(device, _loss(block_sizes_for(device.device_kind)), specs)


def _temp_bytes(compiled) -> int:
    return compiled.memory_analysis().temp_size_in_bytes


class TestBackwardMemory:
    """Growth of the backward's temporary memory from T to 4T (S = T): about 4x when it is O(T), 16x when it
    holds T x S probabilities. Batch 1, 2 query heads over 1 KV head."""

    def _growth(self, compile_at, T: int):
        small, large = (_temp_bytes(compile_at(n)) for n in (T, 4 * T))
        return large / small

    def test_on_cpu_in_interpret_mode(self):
        # The CPU program of the TPU interpret mode: its temporaries are the kernels' operands and outputs (the
        # interpreter keeps kernel buffers on the host side, O(tile) each), so they show what the kernels need.
        compile_at = lambda tiles, interpret: lambda T: (  # noqa: E731
            jax.jit(_loss(tiles, interpret=interpret)).lower(*_specs(1, T, T, 2, 1, 16, jnp.float32)).compile())
        kernel = self._growth(compile_at(BlockSizes(block_q=64, block_k=64), True), 256)
        reference = self._growth(compile_at(None, False), 256)
        assert kernel < 5 and reference > 12, (kernel, reference)

    def test_on_tpu_v5p(self):
        # The TPU program itself (v5p's compile reports its temporaries; v5e's reported 0 for these shapes). From
        # 1,024 tokens: at 256 the TPU program's fixed buffers still outweigh the per-token ones.
        device = _topology_device("v5p")
        sharding = jax.sharding.SingleDeviceSharding(device)
        compile_at = lambda tiles: lambda T: _compile_for(  # noqa: E731
            device, _loss(tiles), _specs(1, T, T, 2, 1, 128, jnp.bfloat16, sharding))
        kernel = self._growth(compile_at(BlockSizes(block_q=128, block_k=128)), 1024)
        reference = self._growth(compile_at(None), 1024)
        assert kernel < 5 and reference > 12, (kernel, reference)
