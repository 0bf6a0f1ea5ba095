"""Train a Jacobi Forcing model from a YAML config.

    python -m jf_jax.train configs/tiny.yaml --run-dir runs/tiny [key=value ...]

Overrides use dotted keys, e.g. ``optim.learning_rate=3e-4 train.steps=200 data.schedule=random``. Running the
same command again on the same run dir resumes from its last checkpoint. The run dir layout (config snapshot,
metrics.jsonl, loss_curve.png, checkpoints/, params/ + model_config.json) is documented in jf_jax/weights/run_dir.py.

Several hosts (a TPU slice, a GPU cluster): run the same command on every host with ``--distributed``
(``jax.distributed.initialize()`` finds the coordinator on TPU VMs and under SLURM / Open MPI), or name it with
``--coordinator HOST:PORT --num-processes N --process-id I``. The config's mesh then spans every process's devices
(``mesh: {data: D, fsdp: -1}``); process 0 writes the run's files, orbax checkpoints are written by all together,
and the run directory must be on storage every host sees.
"""

from __future__ import annotations

import argparse
import sys
import time

from jf_jax.cli.distributed import add_distributed_args, init_distributed
from jf_jax.cli.output_paths import directory_problem
from jf_jax.model.config import ConfigError
from jf_jax.training.config import ConfigKeyError, check_before_training, load_config
from jf_jax.training.loop import NonFiniteLossError, run_training
from jf_jax.training.setup import DroppedSequencesError
from jf_jax.training.trajectories import TrajectoryFormatError

# Faults of the config or its data that the CLI reports in one line (exit 2); anything else is a bug, and keeps
# its traceback.
INPUT_ERRORS = (ConfigKeyError, ConfigError, TrajectoryFormatError)


class _StepLog:
    """Log lines for runs without a progress bar (background runs, logs in files): the first step's time, which is
    mostly compilation, then every ``every_s`` seconds the step reached and the rate since the first step."""

    def __init__(self, total: int, every_s: float):
        self.total, self.every_s = total, every_s
        self.started = time.monotonic()
        self.first: tuple[int, float] | None = None
        self.last_line = 0.0

    def __call__(self, step: int, metrics: dict) -> None:
        now = time.monotonic() - self.started
        if self.first is None:
            self.first = (step, now)
            line = f"first step in {now:.1f}s (compilation included)"
        elif now - self.last_line >= self.every_s or step == self.total:
            rate = (step - self.first[0]) / max(now - self.first[1], 1e-9)
            line = f"{rate:.2f} steps/s since the first"
        else:
            return
        self.last_line = now
        print(f"[{now:7.1f}s] step {step}/{self.total}: loss/total {metrics['loss/total']:.4f}, {line}", flush=True)


def _fail(e: Exception) -> int:
    """One line on stderr (the message's own line breaks folded) and the usage-error status."""
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jf-jax train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="configs/*.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (dotted keys)")
    parser.add_argument("--run-dir", required=True, help="output directory (resumed if it exists)")
    parser.add_argument("--stop-at-step", type=int, default=None, help="stop early at this step (resumable)")
    parser.add_argument("--stop-after-minutes", type=float, default=None,
                        help="stop after the first step that ends this long after training started (resumable)")
    parser.add_argument("--export-on-stop", action="store_true",
                        help="an early stop also exports that step's weights to RUN_DIR/params (to evaluate it)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar; a log line at the first step (compilation) and every --log-every-s")
    parser.add_argument("--log-every-s", type=float, default=60.0,
                        help="with --no-progress: seconds between log lines (steps, steps/s, loss)")
    add_distributed_args(parser)
    args = parser.parse_intermixed_args(argv)
    init_distributed(args)
    try:  # before the run directory is made: a mistyped key leaves nothing behind
        tcfg = load_config(args.config, args.overrides)
        check_before_training(tcfg)
    except INPUT_ERRORS as e:
        return _fail(e)
    problem = directory_problem(args.run_dir)  # before any work: not a traceback after the data and the model
    if problem:
        print(f"error: cannot write the run directory {args.run_dir}: {problem}", file=sys.stderr)
        return 2
    try:
        stop_after_s = None if args.stop_after_minutes is None else 60.0 * args.stop_after_minutes
        on_step = _StepLog(tcfg.train.steps, args.log_every_s) if args.no_progress else None
        result = run_training(tcfg, args.run_dir, progress=not args.no_progress, stop_at_step=args.stop_at_step,
                              stop_after_s=stop_after_s, export_on_stop=args.export_on_stop, on_step=on_step)
    except (NonFiniteLossError, DroppedSequencesError, *INPUT_ERRORS) as e:
        return _fail(e)
    last = result.metrics[max(result.metrics)] if result.metrics else {}
    print(f"{args.run_dir}: step {result.step}/{tcfg.train.steps}, {result.num_sequences} sequences "
          f"({result.num_dropped} longer than the largest bucket left out), "
          f"final loss/total {last.get('loss/total', float('nan')):.4f}")
    return 0

