"""The multi-process options every command that runs on several hosts shares (``train``, ``collect``, ``evaluate``).

Several hosts (a TPU slice, a GPU cluster) run the same command with ``--distributed``
(``jax.distributed.initialize()`` finds the coordinator on TPU VMs and under SLURM / Open MPI), or name it with
``--coordinator HOST:PORT --num-processes N --process-id I``.
"""

from __future__ import annotations

import argparse

OPTIONS = ("distributed", "coordinator", "num_processes", "process_id", "cpu_collectives")
"""The options ``add_distributed_args`` adds, as ``argparse`` names them: how a process joins a run, not what it
computes (a report's settings leave them out)."""


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--distributed", action="store_true",
                        help="join a multi-process run (jax.distributed.initialize; see above)")
    parser.add_argument("--coordinator", help="HOST:PORT of process 0 (implies --distributed)")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--cpu-collectives", choices=("gloo", "mpi"),
                        help="CPU-only multi-process runs: the collectives implementation (e.g. gloo)")


def init_distributed(args: argparse.Namespace) -> None:
    """Joins the multi-process run the arguments ask for (nothing without ``--distributed`` / ``--coordinator``)."""
    if not (args.distributed or args.coordinator):
        return
    import jax

    if args.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", args.cpu_collectives)
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                               process_id=args.process_id)


def distributed_problem(args: argparse.Namespace) -> str | None:
    """Why the multi-process options cannot make a run (one line for the CLI), or None; checked before anything
    loads. Without ``--distributed`` / ``--coordinator`` the others would be ignored, a one-process run in their
    place; a process id must name one of ``--num-processes``."""
    joining = args.distributed or args.coordinator
    given = [f"--{name.replace('_', '-')}" for name in ("num_processes", "process_id", "cpu_collectives")
             if getattr(args, name) is not None]
    if given and not joining:
        return f"{', '.join(given)} without --distributed or --coordinator: the run would be one process"
    if args.num_processes is not None and args.num_processes < 1:
        return f"--num-processes must be a positive integer, got {args.num_processes}"
    if args.process_id is not None and (args.process_id < 0 or (args.num_processes is not None
                                                                and args.process_id >= args.num_processes)):
        count = "" if args.num_processes is None else f" of --num-processes {args.num_processes}"
        return f"--process-id {args.process_id} names no process{count} (ids count from 0)"
    return None
