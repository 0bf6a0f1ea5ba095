"""Before renting accelerators: compile a Jacobi Forcing run's real programs at the target's shapes with abstract
inputs (nothing allocated) and read what XLA says they need per device (``jf-jax plan``).

Two kinds of program, each lowered and compiled on the process's devices arranged as the planned
("data", "fsdp", "tensor") mesh (on a CPU, simulated with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``):

* the train step, ``training.step.make_train_step(...).lower(state, batch, reference)``: float32 parameters and
  AdamW state (``training.state``), bfloat16 compute, the recipe's loss (configs/recipe.yaml), a packed batch of
  ``batch`` rows of ``seq_len`` tokens, the frozen bfloat16 reference when the AR term distils from it;
* decode steps: the cached forward of ``n`` tokens for ``rows`` rows over a KV cache of ``context`` committed slots,
  then float32 logits and the argmax (``tuning.measure.measure_latency``'s step), bfloat16 weights in the decode
  view placed as ``decoding.placement.place_params`` places them, rows over ``data`` x ``fsdp``; for ``n`` = the
  Jacobi block and ``n`` = 1 (AR).

Each compiled program gives XLA's ``memory_analysis()`` (bytes per device: arguments, temporaries, outputs) and
``cost_analysis()``, and its HLO text the collectives, FLOPs and bytes per step (``tuning.hlo_stats``, which counts
loops as they run). Memory figures are XLA:CPU's buffer assignment at the target's shapes: its temporaries are
not a GPU's or TPU's (``plan_report`` says how that is read). The decode steps are traced for an accelerator
(``ACCELERATOR``, passed to the model as its ``platform``: no ``cpu_kernels``, the accelerators' decode dots); the
train step has nothing that differs by platform but its attention, which is the plain-JAX reference XLA:CPU
compiles (a GPU or TPU runs the Pallas kernel, O(T) memory per head, one device's rows and heads on each device).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.decoding import placement
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import COMPILER_OPTIONS
from jf_jax.model.sharding import BATCH_AXES, ShardingRules, make_mesh, mesh_problem, tensor_split_problem
from jf_jax.tuning.hlo_stats import HloStats, hlo_stats

TEACHER_ROUND = 16  # packing rounds teacher lengths up to this (training.packing._TEACHER_ROUND)
ACCELERATOR = "gpu"
"""The platform the decode steps are built for (``model.transformer.forward``'s ``platform``). GPUs and TPUs build
them alike (no ``cpu_kernels``, bfloat16 dots untiled, ``model.weight_matmul.dot_rows``), so one serves every
target; a CPU's row tiles would be loops that also split the rows a mesh spreads."""


def compiler_options() -> dict | None:
    """XLA options every planned program is compiled with on this process's backend: the decode programs' own
    (``decode_jit.COMPILER_OPTIONS``), for the train step too. XLA:CPU's default YNNPACK fusions (elementwise,
    reduce and dot + elementwise subgraphs) keep their intermediates in buffers YNNPACK allocates itself, outside
    XLA's buffer assignment, which ``memory_analysis()`` reads and so misses them (tens to hundreds of MB per device
    for a small model's train step, growing with the rows: results/studies/plan_7b/, section 4). Restricted to
    individual dots, every buffer is XLA's; an accelerator has no YNNPACK, so its programs are planned from XLA's
    own fusions either way."""
    return COMPILER_OPTIONS.get(jax.default_backend())


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshShape:
    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor

    @property
    def rows_divisor(self) -> int:
        return self.data * self.fsdp

    def __str__(self) -> str:
        return f"data={self.data},fsdp={self.fsdp},tensor={self.tensor}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainShape:
    """One train step's packing: ``batch`` rows of ``seq_len`` tokens (a prompt of ``prompt_len`` and noisy/clean
    block pairs), the reference's ``teacher_len`` tokens per row (default: the prompt and the clean half)."""

    seq_len: int = 2048
    batch: int = 8
    prompt_len: int = 256
    teacher_len: int | None = None
    remat: bool = True
    teacher: str = "reference"
    grad_accum: int = 1

    @property
    def teacher_tokens(self) -> int:
        if self.teacher_len is not None:
            return self.teacher_len
        clean = self.prompt_len + (self.seq_len - self.prompt_len + 1) // 2
        return min(self.seq_len, -(-clean // TEACHER_ROUND) * TEACHER_ROUND)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeShape:
    batch: int = 1
    context: int = 1024
    block_size: int = 16


def plan_problem(cfg: ModelConfig, mesh: MeshShape, train: TrainShape | None, decode_mesh: MeshShape,
                 decode: DecodeShape | None) -> str | None:
    """Why the plan cannot be compiled as asked (one line), or None; checked before any device is touched."""
    for name, m in (("--mesh", mesh), ("--decode-mesh", decode_mesh)):
        problem = mesh_problem(m.data, m.fsdp, m.tensor, m.devices) if -1 not in (m.data, m.fsdp, m.tensor) \
            else "give every axis a size (no -1: a plan has no devices to fill)"
        problem = problem or tensor_split_problem(cfg, m.tensor)
        if problem:
            return f"{name} {m}: {problem}"
    if train is not None:
        t = train
        if t.teacher not in ("reference", "data"):
            return f"--teacher must be reference or data, got {t.teacher!r}"
        if min(t.seq_len, t.batch, t.prompt_len, t.grad_accum) < 1 or t.seq_len % 2:
            return "--seq-len (even), --batch, --prompt-len and --grad-accum must be positive"
        if t.prompt_len >= t.seq_len or not 1 <= t.teacher_tokens <= t.seq_len:
            return f"--prompt-len {t.prompt_len} and --teacher-len {t.teacher_tokens} must be below --seq-len " \
                   f"{t.seq_len}"
        if t.batch % t.grad_accum or (t.batch // t.grad_accum) % mesh.rows_divisor:
            return (f"--batch {t.batch} in {t.grad_accum} micro-batch(es) does not split over the mesh's "
                    f"{mesh.rows_divisor} data x fsdp devices")
        if t.seq_len > cfg.max_position_embeddings:
            return f"--seq-len {t.seq_len} exceeds the model's {cfg.max_position_embeddings} positions"
    if decode is not None:
        if min(decode.batch, decode.context, decode.block_size) < 1:
            return "--decode-batch, --context and --block-size must be positive"
        if decode.batch % decode_mesh.rows_divisor:
            return (f"--decode-batch {decode.batch} does not split over the decode mesh's {decode_mesh.rows_divisor} "
                    "data x fsdp devices")
    return None


def devices_problem(*meshes: MeshShape) -> str | None:
    """Why this process has too few devices for the meshes (the hint for simulated CPU devices), or None."""
    need, have = max(m.devices for m in meshes), jax.device_count()
    if need <= have:
        return None
    return (f"the mesh needs {need} devices and this process has {have}: run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={need} (simulated CPU devices; nothing is allocated)")


def per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs (or arrays) carrying shardings: each leaf's shard."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(tuple(x.shape)) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return int(total)


@dataclasses.dataclass(frozen=True)
class CompiledProgram:
    """What XLA says one compiled program needs and does, per device."""

    name: str
    compile_seconds: float
    parts: dict[str, int]
    """Per-device bytes of the program's inputs, by part (computed from the inputs' shardings)."""
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    cost_flops: float
    """``cost_analysis()["flops"]`` as XLA reports it (a loop body once: see ``hlo_stats``)."""
    cost_bytes: float
    hlo: HloStats

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs not aliased to (donated) arguments + temporaries: the program's buffer assignment."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def to_json(self) -> dict:
        cost = dict(flops=self.cost_flops, bytes_accessed=self.cost_bytes)
        return dict(name=self.name, compile_seconds=self.compile_seconds, input_parts_bytes=self.parts,
                    argument_bytes=self.argument_bytes, output_bytes=self.output_bytes, alias_bytes=self.alias_bytes,
                    temp_bytes=self.temp_bytes, peak_bytes=self.peak_bytes, xla_cost_analysis=cost,
                    hlo=self.hlo.to_json())


def compile_program(name: str, lowered_fn, parts: dict[str, object]) -> CompiledProgram:
    """Compiles ``lowered_fn()`` (a ``Lowered``) with ``compiler_options()`` and reads its analyses; ``parts``: name ->
    abstract inputs."""
    start = time.perf_counter()
    compiled = lowered_fn().compile(compiler_options())
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost or {}
    return CompiledProgram(name=name, compile_seconds=seconds, parts={k: per_device_bytes(v) for k, v in parts.items()},
                           argument_bytes=int(m.argument_size_in_bytes), output_bytes=int(m.output_size_in_bytes),
                           alias_bytes=int(m.alias_size_in_bytes), temp_bytes=int(m.temp_size_in_bytes),
                           cost_flops=float(cost.get("flops", 0.0)), cost_bytes=float(cost.get("bytes accessed", 0.0)),
                           hlo=hlo_stats(compiled.as_text()))


def build_mesh(shape: MeshShape):
    return make_mesh(shape.data, shape.fsdp, jax.devices()[:shape.devices], tensor=shape.tensor)


def train_configs(cfg: ModelConfig, train: TrainShape):
    """(model, loss, optimizer configs) of the planned train step: configs/recipe.yaml's loss and AdamW."""
    from jf_jax.training.losses import LossConfig
    from jf_jax.training.state import OptimConfig

    model = cfg.replace(dtype="bfloat16", param_dtype="float32", remat=train.remat)
    loss = LossConfig(ar_weight=10.0, consistency_weight=20.0, mask="noise_conditioned", ar_teacher=train.teacher)
    optim = OptimConfig(learning_rate=2e-4, warmup_steps=10, end_lr_ratio=0.1, b1=0.9, b2=0.95, eps=1e-8,
                        clip_norm=1.0, grad_accum=train.grad_accum)
    return model, loss, optim


def abstract_batch(train: TrainShape, mesh, rules: ShardingRules) -> dict:
    """ShapeDtypeStructs of one packed batch (``training.packing.make_batch``'s keys and shapes), split by rows."""
    from jf_jax.model.sharding import batch_shardings
    from jf_jax.training.packing import BATCH_KEYS

    B, L = train.batch, train.seq_len
    shapes = {k: (B, L // 2) if k.startswith("cons_") else (B, train.teacher_tokens) if k == "teacher_index"
              else (B, L) for k in BATCH_KEYS}
    shardings = batch_shardings({k: np.zeros((1, 1)) for k in BATCH_KEYS}, mesh, rules)
    return {k: jax.ShapeDtypeStruct(shapes[k], jnp.float32 if k.endswith("_weight") else jnp.int32,
                                    sharding=shardings[k]) for k in BATCH_KEYS}


def train_inputs(cfg: ModelConfig, train: TrainShape, mesh, total_steps: int = 1000):
    """(step function, abstract state, abstract batch, abstract reference or None) of the planned train step."""
    from jf_jax.model.params import abstract_params
    from jf_jax.training.state import abstract_state, make_optimizer, state_shardings
    from jf_jax.training.step import make_train_step, reference_params

    model, loss, optim = train_configs(cfg, train)
    rules = ShardingRules()
    optimizer = make_optimizer(model, optim, total_steps)
    params = abstract_params(model)
    shardings = state_shardings(model, optimizer, params, mesh, rules)
    reference = None
    if train.teacher == "reference":
        shapes = jax.eval_shape(lambda p: reference_params(p, model), params)
        reference = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                                 shardings.params)
    step = make_train_step(model, loss, optim, total_steps, mesh, rules, shardings, reference=reference)
    return step, abstract_state(model, optimizer, params, shardings), abstract_batch(train, mesh, rules), reference


def compile_train(cfg: ModelConfig, mesh_shape: MeshShape, train: TrainShape) -> CompiledProgram:
    mesh = build_mesh(mesh_shape)
    step, state, batch, reference = train_inputs(cfg, train, mesh)
    parts = dict(params=state.params, optimizer=(state.opt_state, state.step), reference=reference, batch=batch)
    return compile_program("train_step", lambda: step.lower(state, batch, reference), parts)


def decode_inputs(cfg: ModelConfig, decode: DecodeShape, tokens: int, mesh):
    """(abstract decode view, tokens, KV cache) of one cached forward: bfloat16 weights placed as ``place_params``
    places them; the cache [L, B, S, K, Dh] split by rows over data x fsdp and by KV heads over tensor (where the
    decoders' programs make it, XLA propagates the same split), ``context + tokens`` slots."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jf_jax.model.decode_view import decode_view
    from jf_jax.model.kv_cache import KVCache
    from jf_jax.model.params import abstract_params

    model = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    view = jax.eval_shape(decode_view, abstract_params(model))
    view = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), view,
                        placement.view_shardings(mesh, view, model))
    heads = "tensor" if model.num_kv_heads % mesh.shape["tensor"] == 0 and mesh.shape["tensor"] > 1 else None
    kv_sh = NamedSharding(mesh, P(None, BATCH_AXES, None, heads, None))
    cache = KVCache.abstract(model, decode.batch, decode.context + tokens)
    rows = NamedSharding(mesh, P(BATCH_AXES))
    cache = KVCache(k=jax.ShapeDtypeStruct(cache.k.shape, cache.k.dtype, sharding=kv_sh),
                    v=jax.ShapeDtypeStruct(cache.v.shape, cache.v.dtype, sharding=kv_sh),
                    lengths=jax.ShapeDtypeStruct((decode.batch,), jnp.int32, sharding=rows))
    ids = jax.ShapeDtypeStruct((decode.batch, tokens), jnp.int32, sharding=rows)
    return model, view, ids, cache


def decode_step(model: ModelConfig, platform: str = ACCELERATOR):
    """(params, tokens, cache) -> (argmax tokens, cache): one cached forward of ``model`` + float32 logits + argmax,
    built for ``platform`` (``measure.measure_latency``'s step)."""
    from jf_jax.decoding.common import greedy
    from jf_jax.model.transformer import forward, logits

    def step(params, tokens, cache):
        hidden, cache = forward(params, model, tokens, cache=cache, platform=platform)
        return greedy(logits(params, model, hidden, platform)), cache
    return step


def compile_decode(cfg: ModelConfig, mesh_shape: MeshShape, decode: DecodeShape, tokens: int,
                   platform: str = ACCELERATOR) -> CompiledProgram:
    """``decode_step`` of ``tokens`` tokens per row, built for ``platform``, the cache donated (a decode loop updates
    it in place), traced under the mesh as the decoders' programs are."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jf_jax.model.decode_jit import decode_jit

    mesh = build_mesh(mesh_shape)
    model, view, ids, cache = decode_inputs(cfg, decode, tokens, mesh)
    cache_sh = jax.tree.map(lambda x: x.sharding, cache)
    program = decode_jit(decode_step(model, platform), donate_argnums=2,
                         out_shardings=(NamedSharding(mesh, P(BATCH_AXES)), cache_sh))
    head = () if view.lm_head is None else view.lm_head
    parts = dict(weights=(view.layers, view.final_norm, head), embedding=view.embed, kv_cache=(cache.k, cache.v),
                 tokens=(ids, cache.lengths))

    def lower():  # under the mesh, as the decoders trace (``placement.traced_on``): a CPU kernel runs per device
        with placement.traced_on(mesh):
            return program.program().lower(view, ids, cache)
    return compile_program(f"decode_{tokens}", lower, parts)
