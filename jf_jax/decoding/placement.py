"""Decode programs spread over devices: rows over the mesh's batch axes, weights over its ``tensor`` axis.

The mesh is the training mesh (``model.sharding``: ``data``, ``fsdp``, ``tensor``). Every decoder's loop state
has a leading row axis and its per-row bookkeeping runs under ``jax.vmap``, so the programs need no change: the
inputs are placed row-split over ``data`` x ``fsdp``, each weight of the decode view is placed by the same
logical-axis rules as in training (heads, KV heads, MLP units and the vocabulary over ``tensor``), and XLA's
partitioner keeps each device on its rows and its heads, inserting the reductions that split sums need. The one
thing it cannot split is a custom call, so the programs are traced under the mesh (``traced_on``), where the CPU
kernels' cache write and decode attention run on each device's rows and KV heads (``sharding.per_device``). A row's
tokens do not depend on the rows beside it, so the row split changes no token; the tensor split changes the order
of some sums, so a sharded run's tokens are compared with its own AR (and, on the test models, with one device's).
With one device nothing is placed.
"""

from __future__ import annotations

import contextlib
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_view import DecodeView
from jf_jax.model.params import logical_axes
from jf_jax.model.sharding import BATCH_AXES, ShardingRules, make_mesh, tensor_split_problem


def local_rows_mesh() -> Mesh | None:
    """This process's devices as a mesh of rows (data parallel, weights replicated), or None with one device."""
    devices = jax.local_devices()
    return make_mesh(len(devices), 1, devices) if len(devices) > 1 else None


def traced_on(mesh: Mesh | None):
    """The context a decode program is traced (and run) in: under ``mesh`` (``jax.set_mesh``), so that the CPU
    kernels' calls, which XLA cannot partition, run on each device's rows and KV heads (``sharding.per_device``)
    instead of on the whole cache gathered around them; nothing without a mesh (an enclosing one stays)."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def rows_multiple(mesh: Mesh | None) -> int:
    """Batch sizes must be a multiple of this to split evenly over ``mesh``'s batch axes."""
    return 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES)


def place_rows(mesh: Mesh | None, *arrays):
    """``arrays`` (leading axis = rows) split by rows over ``mesh``; unchanged without a mesh."""
    if mesh is None:
        return arrays
    return tuple(jax.device_put(a, NamedSharding(mesh, P(BATCH_AXES))) for a in arrays)


def place_params(mesh: Mesh | None, view: DecodeView, cfg: ModelConfig) -> DecodeView:
    """``view``'s arrays on ``mesh`` as ``view_shardings`` places them; unchanged without a mesh. A packed or int8
    view (the CPU kernels' layouts) is not split: it is refused on a mesh with ``tensor`` or ``fsdp`` devices."""
    if mesh is None:
        return view
    if not rows_only(mesh):
        problem = tensor_split_problem(cfg, mesh.shape["tensor"])
        if problem:
            raise ValueError(problem)
        weights = [w for layer in view.layers for w in layer.values()] + [view.lm_head]
        if not all(w is None or isinstance(w, (tuple, jax.Array, np.ndarray)) for w in weights):
            raise ValueError("packed or int8 decode weights (the CPU kernels' layouts) cannot be sharded: load the "
                             "model with column_shards=1 to decode on a mesh")
    return jax.device_put(view, view_shardings(mesh, view, cfg))


def rows_only(mesh: Mesh) -> bool:
    """Whether ``mesh`` splits only rows, so every device holds the whole decode view."""
    return mesh.shape["tensor"] == 1 and mesh.shape["fsdp"] == 1


def view_shardings(mesh: Mesh, view: DecodeView, cfg: ModelConfig) -> DecodeView:
    """The NamedSharding of each array of ``view`` (arrays or ShapeDtypeStructs) on ``mesh``: replicated on a
    rows-only mesh, else split as its declared logical axes say (``ShardingRules``). ``place_params`` places by
    it, and the planner (``tuning.plan``) compiles abstract views with it."""
    if rows_only(mesh):
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), view)
    rules, axes = ShardingRules(), logical_axes(cfg)

    def put(x, names):
        return NamedSharding(mesh, rules.spec(names, tuple(x.shape), mesh))

    def put_weight(w, names):  # a weight held as column shards: each shard keeps the whole weight's axes
        return tuple(put(s, names) for s in w) if isinstance(w, tuple) else put(w, names)

    layers = tuple({k: put_weight(v, axes["layers"][k][1:]) for k, v in layer.items()} for layer in view.layers)
    head = None if view.lm_head is None else put_weight(view.lm_head, axes.get("lm_head", ("embed", "vocab")))
    return DecodeView(embed=put(view.embed, axes["embed"]), layers=layers, final_norm=put(view.final_norm,
                      axes["final_norm"]), lm_head=head, column_shards=view.column_shards,
                      embed_dtype=view.embed_dtype)
