"""Device mesh and logical-axis sharding rules, for training and for decoding.

The mesh has three axes: ``data`` (pure data parallelism: parameters replicated), ``fsdp`` (data parallel *and*
parameters/optimizer state sharded, gathered per layer by XLA) and ``tensor`` (model parallelism: attention heads,
KV heads, the MLP's hidden units and the vocabulary are split, and XLA inserts the reductions their partial sums
need). Parameters name their dimensions with logical axes (``jf_jax.model.params.logical_axes``); ``ShardingRules``
maps logical axes to mesh axes with Flax's logical partitioning (``flax.linen.logical_to_mesh_axes``, as maxtext
does). Batches are split over ``data`` and ``fsdp`` along their leading (batch) dimension; every device of one
``tensor`` group holds the same rows.

The tensor split is of whole heads, so a model's query heads and KV heads must both divide the ``tensor`` axis
(``tensor_split_problem``): a mesh that would split a head, or leave some devices without a KV head, is refused by
name before anything loads, rather than silently replicated. A head's attention reads only its own KV head and its
row's tokens, and a KV-cache write touches only its row's slots, so such a kernel (an opaque custom call XLA cannot
partition: the training attention's Pallas kernels, the decode steps' CPU kernels) runs on each device's rows and
heads under ``jax.shard_map`` with no collective (``per_device``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import logical_axes

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
TENSOR_RULES = (("q_heads", "tensor"), ("kv_heads", "tensor"), ("mlp", "tensor"), ("vocab", "tensor"))
"""The logical axes split over ``tensor``: Megatron's layout (column-parallel q/k/v and gate/up, row-parallel wo and
down, a vocabulary-parallel embedding and head)."""


def mesh_problem(data: int, fsdp: int, tensor: int, device_count: int) -> str | None:
    """Why a (data, fsdp, tensor) mesh cannot be built from ``device_count`` devices, or None (-1: the rest)."""
    sizes = dict(data=data, fsdp=fsdp, tensor=tensor)
    if list(sizes.values()).count(-1) > 1:
        return "at most one mesh axis may be -1"
    bad = [f"{k}={v}" for k, v in sizes.items() if v != -1 and (isinstance(v, bool) or not isinstance(v, int) or v < 1)]
    if bad:
        return f"mesh axes must be positive integers (or -1 for one of them), got {', '.join(bad)}"
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if fixed > device_count or (-1 in sizes.values() and device_count % fixed):
        return (f"mesh data={data} x fsdp={fsdp} x tensor={tensor} does not fit the {device_count} device(s) "
                f"here")
    return None


def make_mesh(data: int = 1, fsdp: int = -1, devices=None, *, tensor: int = 1) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh; ``-1`` for one axis takes all remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    problem = mesh_problem(data, fsdp, tensor, len(devices))
    if problem:
        raise ValueError(problem)
    sizes = [data, fsdp, tensor]
    if -1 in sizes:
        sizes[sizes.index(-1)] = len(devices) // math.prod(v for v in sizes if v != -1)
    return Mesh(np.array(devices[: math.prod(sizes)]).reshape(sizes), MESH_AXES)


def tensor_split_problem(cfg: ModelConfig, tensor: int) -> str | None:
    """Why ``cfg``'s model cannot be split over a ``tensor`` axis of that size, or None."""
    if tensor <= 1:
        return None
    wrong = [f"{name} {n}" for name, n in (("query heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads))
             if n % tensor]
    if wrong:
        return (f"the model's {' and '.join(wrong)} do not divide the tensor axis of {tensor}: choose tensor from "
                f"the common divisors of {cfg.num_heads} and {cfg.num_kv_heads}, and put the other devices on "
                "data or fsdp")
    return None


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis -> mesh axis (or None), in Flax's rule format. Unlisted logical axes are replicated."""

    rules: tuple[tuple[str, str | None], ...] = (("embed", "fsdp"),) + TENSOR_RULES
    batch: tuple[str, ...] = BATCH_AXES

    def spec(self, axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
        """The PartitionSpec of one array: Flax's mapping (a mesh axis goes to the first dimension that claims it),
        then any dimension that its mesh axis size does not divide (or whose axis the mesh lacks) is replicated
        instead (heads are checked to divide ``tensor`` before a run starts: ``tensor_split_problem``)."""
        mapped = nn.logical_to_mesh_axes(axes, self.rules)
        return P(*(m if m in mesh.shape and dim % mesh.shape[m] == 0 else None for m, dim in zip(mapped, shape)))

    def batch_spec(self, ndim: int) -> P:
        return P(self.batch, *([None] * (ndim - 1)))

    def batch_divisor(self, mesh: Mesh) -> int:
        return math.prod(mesh.shape[a] for a in self.batch)


def param_shardings(cfg: ModelConfig, params_like, mesh: Mesh, rules: ShardingRules):
    """NamedShardings for a parameter tree (arrays or ShapeDtypeStructs) of ``cfg``'s model."""
    axes = logical_axes(cfg)
    return jax.tree.map(lambda a, x: NamedSharding(mesh, rules.spec(a, tuple(x.shape), mesh)), axes, params_like,
                        is_leaf=lambda a: isinstance(a, tuple) and all(isinstance(s, str) for s in a))


def batch_shardings(batch_like, mesh: Mesh, rules: ShardingRules):
    """Batch arrays are split along their leading dimension over the batch mesh axes."""
    return jax.tree.map(lambda x: NamedSharding(mesh, rules.batch_spec(np.ndim(x))), batch_like)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def constrain_rows(x):
    """``x`` [rows, ...] kept split by rows over the batch axes of the mesh the program is traced under
    (``jax.set_mesh``, as the train step does); unchanged outside one. Without it XLA's partitioner may follow the
    fsdp-split hidden axis of the weights into the activations and all-reduce whole batches of them, where FSDP
    means gathering each layer's weights instead."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = tuple(a for a in BATCH_AXES if a in (mesh.axis_names or ()))
    if not axes or math.prod(mesh.shape[a] for a in axes) == 1 or x.shape[0] % math.prod(mesh.shape[a] for a in axes):
        return x
    return jax.lax.with_sharding_constraint(x, P(axes, *([None] * (x.ndim - 1))))


ROWS, HEADS = "rows", "heads"
"""The roles ``per_device`` reads in a layout (one entry per dimension of an array; None: kept whole): a row
dimension goes over the batch axes, a head dimension over ``tensor``."""


def _is_layout(x) -> bool:
    return isinstance(x, tuple) and all(d in (ROWS, HEADS, None) for d in x)


def per_device(kernel: Callable, args: tuple, layouts: tuple, out_layouts):
    """``kernel(*args)`` run by every device on its own rows and heads, under the mesh the program is traced under
    (``jax.set_mesh``, as the train step and the decoders are); called as it is outside one.

    A custom call (a Pallas kernel, a ``cpu_kernels`` call) is opaque to XLA's partitioner, so without this it
    gathers the call's operands whole around it on every device (or, for a call it must place on one device, onto
    that one). ``layouts`` gives each argument's layout (a tuple of ``ROWS``, ``HEADS`` or None per dimension; one
    layout covers every array of an argument that is a pytree), ``out_layouts`` the output's (a tuple of layouts
    for a tuple of outputs). Rows go over the batch axes when every row dimension divides evenly, heads over
    ``tensor`` when every head dimension does (``tensor_split_problem`` checks a model's heads before a run);
    otherwise that axis stays whole on every device: correct, at the cost of a gather. Every dimension of a role
    is cut into equal contiguous parts, so what a kernel pairs by proportion stays together on one device: the G
    query heads of a KV head, and the B // Bc query rows that read one cache row. An output aliased to an input
    (an in-place cache update) stays aliased: each device's call updates its own block.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return kernel(*args)
    sized = [(role, n) for arg, layout in zip(args, layouts) for leaf in jax.tree.leaves(arg)
             for role, n in zip(layout, leaf.shape)]
    rows = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
    if any(n % math.prod(mesh.shape[a] for a in rows) for role, n in sized if role == ROWS):
        rows = ()
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and all(n % tensor == 0 for role, n in sized if role == HEADS) else None
    if math.prod(mesh.shape[a] for a in rows) == 1 and heads is None:
        return kernel(*args)
    axes = {ROWS: rows or None, HEADS: heads, None: None}

    def spec(layout):
        return P(*(axes[role] for role in layout))

    out_specs = spec(out_layouts) if _is_layout(out_layouts) else tuple(spec(x) for x in out_layouts)
    # check_vma=False: a custom call's output types do not say along which mesh axes they vary; here each output
    # block is its device's own, as out_specs says.
    return jax.shard_map(kernel, in_specs=tuple(spec(x) for x in layouts), out_specs=out_specs,
                         check_vma=False)(*args)


def attention_per_device(kernel: Callable, q, k, v, q_meta, k_meta):
    """``kernel(q, k, v, q_meta, k_meta)`` (q [B, T, H, D], k and v [B, S, K, D], metadata fields [B, N]) on each
    device's rows and heads (``per_device``): the training attention's Pallas kernels."""
    heads, by_rows = (ROWS, None, HEADS, None), (ROWS, None)
    return per_device(kernel, (q, k, v, q_meta, k_meta), (heads, heads, heads, by_rows, by_rows), heads)
