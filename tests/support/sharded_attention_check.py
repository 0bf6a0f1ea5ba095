"""Attention on (data, fsdp, tensor) meshes of 8 simulated CPU devices; prints a JSON report on its last stdout line.

Started in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8, with one argument: ``kernels``
(tests/test_pallas_sharded.py) or ``decode`` (tests/test_sharded_decoding.py). The tiny models have 4 query and 2 KV
heads, so tensor = 2 gives each device 2 query heads and their KV head.

``kernels``: the training attention's Pallas kernels. For each (the Triton one and the TPU one, both interpreted)
and each mesh:

* the noise-conditioned training loss and its gradient over every parameter, sharded, against one device's, and
  the all-gathers of its compiled program against those of the same loss with the plain-JAX attention;
* the attention alone (``transformer._attend``, as the model calls it) and its gradients on q, k, v placed as the
  model places them: the compiled program's all-gathers, against those of the kernel called without
  ``sharding.attention_per_device`` (what XLA does with a call it cannot partition).

Then, for a TPU target from this CPU: ``jax.export(platforms=["tpu"])`` of the same gradient program on the mesh,
the operand shapes of each ``tpu_custom_call`` (each device's rows and heads), and the unwrapped kernel's refusal;
with the ``libtpu`` package importable, the same program compiled for an 8-chip TPU v5e slice and its all-gathers.

``decode``: no decoder runs a Pallas kernel (decode attention is ``model.cached_attention``, plain JAX, off the
CPU). The planner's decode steps on each mesh, built for an accelerator and for this CPU (either way the cache write
and the decode attention, the CPU kernels' custom calls or their plain-JAX twins, run per device under the mesh the
step is traced under: ``sharding.per_device``): the bytes of each kind of collective, against one layer's whole KV
cache, and for the CPU's step the kernels it calls and its per-device computations; the accelerator's step on a
mesh that splits rows alone; with libtpu importable, also the step built for a TPU and compiled for a TPU v5e
slice.
"""

import importlib.util
import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jf_jax.model import transformer
from jf_jax.model.sharding import BATCH_AXES, MESH_AXES, ShardingRules, make_mesh, param_shardings
from jf_jax.training.losses import LossConfig, loss_fn
from jf_jax.training.step import put_batch
from jf_jax.tuning.hlo_stats import hlo_stats
from pallas_kernels import flash_attention
from pallas_kernels.mask import MASK_NOISE_CONDITIONED, TokenMeta
from tests.support.train_models import TINY, numpy_params, synthetic_batch

MESHES = ((1, 1, 2), (2, 1, 2), (2, 2, 2))
TRAINING_MESHES = (MESHES[0], MESHES[-1])
"""The kernels' training loss on tensor alone and on all three axes: data x tensor, between them, would add
compiles and no split of rows or heads that 2x2x2 does not already give each device (the decode check keeps it)."""
IMPLS = {"pallas_triton": "triton", "pallas_tpu": "tpu"}
B, T, H, K, D = 8, 32, 4, 2, 8  # the attention-alone case: TINY's heads, rows for every mesh
SEQ = 40  # the loss's packed rows
# The Triton kernel under remat, as the recipe trains: its shard_map inside a checkpointed layer scan. TPU interpret
# mode's host callbacks are effects, which jax.checkpoint does not take (on one device either).
REMAT = {"pallas_triton": True, "pallas_tpu": False}


def collectives(hlo: str) -> dict:
    """Count of each collective in compiled HLO text, and the result shapes of its all-gathers."""
    ops = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
    counts = {op: len(re.findall(rf"= \S+ {op}(?:-start)?\(", hlo)) for op in ops}
    counts["all_gather_shapes"] = sorted(s.split("{")[0] for s in re.findall(r"= (\S+) all-gather(?:-start)?\(", hlo))
    return counts


def loss_and_grads(cfg, params, batch, mesh):
    """(loss, gradients, compiled HLO text) of the training loss, on ``mesh`` (None: one device)."""
    fn = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, cfg, b, LossConfig())[0]))
    if mesh is None:
        return *fn(params, batch), ""
    rules = ShardingRules()
    params = jax.device_put(params, param_shardings(cfg, params, mesh, rules))
    batch = put_batch(batch, mesh, rules)
    with jax.set_mesh(mesh):
        loss, grads = fn(params, batch)
        return loss, grads, fn.lower(params, batch).compile().as_text()


def attention_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, n, D)), jnp.float32) for n in (H, K, K))
    # Each row: a 8-token prompt and three noisy/clean block pairs of 4 (the packed training layout).
    stream = np.array([0] * 8 + [1] * 4 + [2] * 4 + [1] * 4 + [2] * 4 + [1] * 4 + [2] * 4, np.int32)
    block = np.array([-1] * 8 + [0] * 8 + [1] * 8 + [2] * 8, np.int32)
    position = np.array(list(range(8)) + [8 + 4 * (j // 8) + j % 4 for j in range(24)], np.int32)
    row = lambda x: jnp.asarray(np.broadcast_to(x, (B, T)))  # noqa: E731
    return q, k, v, TokenMeta(row(position), row(np.zeros(T, np.int32)), row(stream), row(block))


def attention_grads(cfg, inputs, mesh, wrapped: bool = True, platform: str | None = None):
    """value_and_grad of sum(attention ** 2) over q, k, v, jitted; with ``mesh``, the inputs placed as the model
    places them (rows over data x fsdp, heads over tensor). ``wrapped``: through the model's attention (the kernel
    on each device's rows and heads); else the kernel called as it is."""
    q, k, v, meta = inputs

    def loss(q, k, v):
        if wrapped:
            out = transformer._attend(cfg, q, k, v, meta, meta, MASK_NOISE_CONDITIONED, platform)
        else:
            out = flash_attention.attention(q, k, v, meta, meta, backend=IMPLS[cfg.attention_impl],
                                            interpret=(platform or jax.default_backend()) == "cpu")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    if mesh is None:
        return fn, (q, k, v)
    heads = NamedSharding(mesh, P(BATCH_AXES, None, "tensor", None))
    return fn, tuple(jax.device_put(x, heads) for x in (q, k, v))


def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def on_meshes(host_params, host_batch, inputs) -> dict:
    report = {}
    for shape in TRAINING_MESHES:  # the plain-JAX attention, which XLA partitions itself
        mesh = make_mesh(shape[0], shape[1], jax.devices()[:int(np.prod(shape))], tensor=shape[2])
        for remat in (False, True):
            hlo = loss_and_grads(TINY.replace(attention_impl="reference", remat=remat), host_params, host_batch,
                                 mesh)[2]
            report[f"reference{'-remat' * remat} {'x'.join(map(str, shape))}"] = {"loss_program": collectives(hlo)}
    for impl in IMPLS:
        cfg = TINY.replace(attention_impl=impl, remat=REMAT[impl])
        one_loss, one_grads, _ = loss_and_grads(cfg, host_params, host_batch, None)
        fn, args = attention_grads(cfg, inputs, None)
        one_attention = fn(*args)
        for shape in TRAINING_MESHES:
            mesh = make_mesh(shape[0], shape[1], jax.devices()[:int(np.prod(shape))], tensor=shape[2])
            loss, grads, hlo = loss_and_grads(cfg, host_params, host_batch, mesh)
            record = {"remat": cfg.remat, "loss": float(loss), "loss_one_device": float(one_loss),
                      "max_grad_diff": max_diff(grads, one_grads),
                      "max_grad": max(float(np.max(np.abs(g))) for g in jax.tree.leaves(one_grads)),
                      "loss_program": collectives(hlo)}
            with jax.set_mesh(mesh):
                fn, args = attention_grads(cfg, inputs, mesh)
                value, grads = fn(*args)
                record["attention_value"] = [float(value), float(one_attention[0])]
                record["attention_max_grad_diff"] = max_diff(grads, one_attention[1])
                record["attention_max_grad"] = max(float(np.max(np.abs(g))) for g in one_attention[1])
                record["attention_program"] = collectives(fn.lower(*args).compile().as_text())
                fn, args = attention_grads(cfg, inputs, mesh, wrapped=False)
                record["unwrapped_attention_program"] = collectives(fn.lower(*args).compile().as_text())
            report[f"{impl} {'x'.join(map(str, shape))}"] = record
    return report


def tpu_devices():
    """The 8 chips of a TPU v5e slice described on this host (``jax.experimental.topologies``), or None without
    the libtpu package (the TPU compiler)."""
    if importlib.util.find_spec("libtpu") is None:
        return None
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4").devices


def custom_call_operands(module: str) -> list[str]:
    """The operand types of each ``tpu_custom_call`` in an exported StableHLO module."""
    calls = [line for line in module.splitlines() if "tpu_custom_call" in line and "stablehlo.custom_call" in line]
    return [line.rsplit(": (", 1)[-1].split(") ->")[0] for line in calls]


def for_tpu(inputs) -> dict:
    """The gradient program built for a TPU (compiled Mosaic kernels) on a 2x2x2 mesh: exported on this CPU, and
    compiled for a TPU v5e slice where libtpu is importable."""
    cfg = TINY.replace(attention_impl="auto")
    mesh = make_mesh(2, 2, jax.devices()[:8], tensor=2)
    report = {}
    with jax.set_mesh(mesh):
        fn, args = attention_grads(cfg, inputs, mesh, platform="tpu")
        module = export.export(fn, platforms=["tpu"])(*args).mlir_module()
        report["export_operands"] = custom_call_operands(module)
        fn, args = attention_grads(cfg.replace(attention_impl="pallas_tpu"), inputs, mesh, False, "tpu")
        try:
            export.export(fn, platforms=["tpu"])(*args)
            report["unwrapped_export"] = "exported"
        except NotImplementedError as e:
            report["unwrapped_export"] = str(e)
    devices = tpu_devices()
    if devices is None:
        return report
    tpu_mesh = Mesh(np.array(devices).reshape(2, 2, 2), MESH_AXES)
    q, k, v, meta = inputs
    heads = NamedSharding(tpu_mesh, P(BATCH_AXES, None, "tensor", None))
    rows = NamedSharding(tpu_mesh, P(BATCH_AXES, None))
    # bfloat16, head dim 128, 256 tokens: a shape Mosaic lays out (the tiny model's head dim 8 is for interpret mode).
    specs = [jax.ShapeDtypeStruct((B, 256, n, 128), jnp.bfloat16, sharding=heads) for n in (H, K, K)]
    meta_specs = TokenMeta(*[jax.ShapeDtypeStruct((B, 256), jnp.int32, sharding=rows)] * 4)

    def loss(q, k, v, meta):
        out = transformer._attend(cfg, q, k, v, meta, meta, MASK_NOISE_CONDITIONED, "tpu")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    with jax.set_mesh(tpu_mesh):
        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(*specs, meta_specs).lower(
            lowering_platforms=("tpu",)).compile()
    text = compiled.as_text()
    report["tpu_compile"] = collectives(text)
    report["tpu_compile"]["kernel_shapes"] = [line.split(" = ", 1)[1].split(" custom-call(")[0]
                                              for line in text.splitlines()
                                              if "custom-call(" in line and "jf_flash_attention_tpu" in line]
    return report


def cpu_kernel_calls(cfg, mesh_shape, decode, tokens) -> dict:
    """The ``cpu_kernels`` targets in the decode step built for this CPU and lowered under its mesh, how many calls
    of them it makes, and how many of its computations run per device (``sdy.manual_computation``:
    ``sharding.per_device``'s shard_maps)."""
    from jf_jax.tuning import plan

    mesh = plan.build_mesh(mesh_shape)
    model, view, ids, cache = plan.decode_inputs(cfg, decode, tokens, mesh)
    with jax.set_mesh(mesh):
        text = jax.jit(plan.decode_step(model, "cpu")).lower(view, ids, cache).as_text()
    calls = re.findall(r"stablehlo\.custom_call @(jf_\w+)", text)
    return {"kernels": sorted(set(calls)), "kernel_calls": len(calls),
            "per_device_calls": text.count("sdy.manual_computation")}


def decode_programs() -> dict:
    """All-gathered bytes per step of the planner's decode steps (one token and a Jacobi block of 4 over 1,020
    committed slots, 4 rows) built for ``plan.ACCELERATOR`` and for this CPU, and one layer's whole K cache. The test
    model with a head size the CPU attention kernel takes (a multiple of 32), so the CPU's step runs both kernels."""
    from jf_jax.tuning import plan
    from tests.support.decoding_models import CFG

    model_cfg = CFG.replace(head_dim=32)
    decode = plan.DecodeShape(batch=4, context=1020, block_size=4)
    layer_cache = 4 * 1024 * model_cfg.num_kv_heads * model_cfg.head_dim * 2  # one layer's keys, bf16 [B, S, K, Dh]
    report = {"layer_cache_bytes": layer_cache}
    devices = tpu_devices()
    for shape in MESHES:
        mesh = plan.MeshShape(data=shape[0], fsdp=shape[1], tensor=shape[2])
        for tokens in (1, 4):
            for platform in (plan.ACCELERATOR, "cpu"):
                program = plan.compile_decode(model_cfg, mesh, decode, tokens, platform=platform)
                record = {"all_gather_bytes": program.hlo.collective_bytes["all-gather"],
                          "collective_bytes": dict(program.hlo.collective_bytes),
                          "kv_cache_bytes_per_device": program.parts["kv_cache"]}
                if platform == "cpu":
                    record.update(cpu_kernel_calls(model_cfg, mesh, decode, tokens))
                report[f"{platform} {'x'.join(map(str, shape))} {tokens}"] = record
            if devices is not None:
                tpu_mesh = Mesh(np.array(devices[:int(np.prod(shape))]).reshape(shape), MESH_AXES)
                model, view, ids, cache = plan.decode_inputs(model_cfg, decode, tokens, tpu_mesh)
                shardings = (NamedSharding(tpu_mesh, P(BATCH_AXES)), jax.tree.map(lambda x: x.sharding, cache))
                compiled = jax.jit(plan.decode_step(model, "tpu"), donate_argnums=2, out_shardings=shardings).trace(
                    view, ids, cache).lower(lowering_platforms=("tpu",)).compile()
                report[f"tpu-compiled {'x'.join(map(str, shape))} {tokens}"] = {
                    "all_gather_bytes": hlo_stats(compiled.as_text()).collective_bytes["all-gather"]}
    for tokens in (1, 4):  # rows alone split (over data): every row and its cache are one device's
        program = plan.compile_decode(model_cfg, plan.MeshShape(data=4), decode, tokens)
        report[f"{plan.ACCELERATOR} 4x1x1 {tokens}"] = {
            "all_gather_bytes": program.hlo.collective_bytes["all-gather"],
            "collective_bytes": dict(program.hlo.collective_bytes)}
    return report


def main(part: str):
    if part == "decode":
        import cpu_kernels

        kernels = cpu_kernels.cache_write_available() and cpu_kernels.attention_available()
        report = {"devices": jax.device_count(), "cpu_kernels": kernels, "decode": decode_programs()}
    else:
        host_params = numpy_params(TINY, seed=0)
        host_batch = synthetic_batch(TINY.vocab_size, 8, SEQ)
        inputs = attention_inputs()
        report = {"devices": jax.device_count(), "meshes": on_meshes(host_params, host_batch, inputs),
                  "tpu": for_tpu(inputs)}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
