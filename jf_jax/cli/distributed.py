"""The multi-process options every command that runs on several hosts shares (``train``, ``collect``).

Several hosts (a TPU slice, a GPU cluster) run the same command with ``--distributed``
(``jax.distributed.initialize()`` finds the coordinator on TPU VMs and under SLURM / Open MPI), or name it with
``--coordinator HOST:PORT --num-processes N --process-id I``.
"""

from __future__ import annotations

import argparse


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
