"""Rows of a batched decode program spread over the local devices: one program, sharded along the row axis.

Every decoder's loop state has a leading row axis and its per-row bookkeeping runs under ``jax.vmap``, so a
batch split by rows over a one-axis mesh needs no change to the programs: the inputs are placed row-sharded,
the parameters replicated, and XLA's partitioner keeps each device on its own rows (a row's tokens do not depend
on the rows beside it, so sharding changes no token). With one local device nothing is placed.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

ROWS = "rows"


def local_rows_mesh() -> Mesh | None:
    """A one-axis mesh over this process's devices, or None when it has one device."""
    devices = jax.local_devices()
    return Mesh(np.array(devices), (ROWS,)) if len(devices) > 1 else None


def rows_multiple(mesh: Mesh | None) -> int:
    """Batch sizes must be a multiple of this to split evenly over ``mesh``."""
    return 1 if mesh is None else mesh.size


def place_rows(mesh: Mesh | None, *arrays):
    """``arrays`` (leading axis = rows) split by rows over ``mesh``; unchanged without a mesh."""
    if mesh is None:
        return arrays
    return tuple(jax.device_put(a, NamedSharding(mesh, P(ROWS))) for a in arrays)


def replicate(mesh: Mesh | None, tree):
    """``tree`` (the parameters) copied to every device of ``mesh``; unchanged without a mesh."""
    return tree if mesh is None else jax.device_put(tree, NamedSharding(mesh, P()))
