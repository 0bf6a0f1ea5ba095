"""Device mesh and logical-axis sharding rules for training.

The mesh has two axes: ``data`` (pure data parallelism: parameters replicated) and ``fsdp`` (data parallel
*and* parameters/optimizer state sharded). Parameters name their dimensions with logical axes
(``jf_jax.model.params.logical_axes``); ``ShardingRules`` maps logical axes to mesh axes with Flax's logical
partitioning (``flax.linen.logical_to_mesh_axes``, as maxtext does). Batches are split over both mesh axes along
their leading (batch) dimension.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import logical_axes

MESH_AXES = ("data", "fsdp")


def make_mesh(data: int = 1, fsdp: int = -1, devices=None) -> Mesh:
    """A ("data", "fsdp") mesh; ``-1`` for one axis takes all remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    if data == -1 and fsdp == -1:
        raise ValueError("at most one mesh axis may be -1")
    if data == -1:
        data = len(devices) // fsdp
    if fsdp == -1:
        fsdp = len(devices) // data
    if data < 1 or fsdp < 1 or data * fsdp > len(devices):
        raise ValueError(f"mesh data={data} x fsdp={fsdp} does not fit {len(devices)} devices")
    return Mesh(np.array(devices[: data * fsdp]).reshape(data, fsdp), MESH_AXES)


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis -> mesh axis (or None), in Flax's rule format. Unlisted logical axes are replicated."""

    rules: tuple[tuple[str, str | None], ...] = (("embed", "fsdp"),)
    batch: tuple[str, ...] = MESH_AXES

    def spec(self, axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
        """The PartitionSpec of one array: Flax's mapping (a mesh axis goes to the first dimension that claims it),
        then any dimension that its mesh axis size does not divide is replicated instead."""
        mapped = nn.logical_to_mesh_axes(axes, self.rules)
        return P(*(m if m is None or dim % mesh.shape[m] == 0 else None for m, dim in zip(mapped, shape)))

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
