"""``--mesh data=D,fsdp=F,tensor=T``: the device mesh a decode, evaluate or collect run spreads over
(``model.sharding``: rows over ``data`` x ``fsdp``, heads, MLP units and vocabulary over ``tensor``).

Parsed when the command line is, and checked against this process's devices before anything loads; whether the
model's heads divide ``tensor`` is checked once its config is known (``model.sharding.tensor_split_problem``).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __str__(self) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in AXES)


def parse_mesh(text: str) -> MeshSpec:
    """``"tensor=2"`` or ``"data=2,tensor=4"`` (unnamed axes are 1) as a ``MeshSpec``; an ``argparse`` type."""
    sizes = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in AXES or name.strip() in sizes:
            raise argparse.ArgumentTypeError(f"--mesh takes {', '.join(a + '=N' for a in AXES)} (each at most once), "
                                             f"got {text!r}")
        try:
            sizes[name.strip()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--mesh {name.strip()} must be a whole number, got {value!r}") from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"--mesh names no axis: {text!r}")
    return MeshSpec(**sizes)


def mesh_error(spec: MeshSpec | None, models: Sequence[str] = ()) -> str | None:
    """Why this process's devices cannot hold ``spec``, or the ``tensor`` axis cannot split the heads of one of
    ``models`` (specs; their configs are read without their weights), as one line for the CLI; None when all is
    well. In a multi-process run, call it after ``jax.distributed`` has joined (counting devices starts the
    runtime). A model spec that cannot be read is left to the load, which names the problem."""
    if spec is None:
        return None
    import jax

    from jf_jax.model.sharding import mesh_problem

    # A process's own devices: in a multi-process run (--distributed) each process decodes its share of the prompts
    # on a mesh of its devices; in one process they are all the devices.
    problem = mesh_problem(spec.data, spec.fsdp, spec.tensor, jax.local_device_count())
    if problem and "does not fit" in problem:
        problem += (" (on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N devices of its cores)")
    if problem:
        return f"--mesh {spec}: {problem}"
    if spec.tensor > 1:
        from jf_jax import weights
        from jf_jax.model.sharding import tensor_split_problem

        for model in models:
            try:
                cfg = weights.read_config(model)
            except (ValueError, OSError):
                continue
            problem = tensor_split_problem(cfg, spec.tensor)
            if problem:
                return f"--mesh {spec}: {model}: {problem}"
    return None


def build_mesh(spec: MeshSpec | None, cfg=None):
    """The mesh of ``spec`` (None: one device, no mesh); with ``cfg``, a model whose heads the ``tensor`` axis
    cannot split is refused (ValueError naming both)."""
    if spec is None:
        return None
    from jf_jax.model.sharding import make_mesh, tensor_split_problem

    problem = None if cfg is None else tensor_split_problem(cfg, spec.tensor)
    if problem:
        raise ValueError(f"--mesh {spec}: {problem}")
    import jax

    return make_mesh(spec.data, spec.fsdp, jax.local_devices(), tensor=spec.tensor)


def plain_layout(spec: MeshSpec | None) -> dict:
    """``api.load_model``'s options for a run on ``spec``: on a mesh, the weights in the plain layout XLA can split
    (one column shard, no CPU-kernel packing); nothing without one."""
    return {} if spec is None else {"column_shards": 1}
