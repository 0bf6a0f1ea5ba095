"""TensorBoard scalars from a run's ``metrics.jsonl``, written with tensorboardX (no TensorFlow).

``metrics.jsonl`` stays the source of truth (a resumed run truncates it to its checkpoint), so the event file is
rewritten from it as a whole rather than appended to: tensorboardX writes a fresh event file into a staging
directory, which then replaces ``RUN_DIR/tensorboard/EVENT_FILE`` in one rename. ``tensorboard --logdir
RUN_DIR/tensorboard`` therefore never shows the steps a crashed run lost, nor two files of the same run.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

from jf_jax.weights import run_dir as rd

EVENT_FILE = "events.out.tfevents.0.jf_jax"


def write_scalars(path: str, rows: list[dict], wall_time: float = 0.0) -> None:
    """Writes one event file at ``path`` with every numeric field of each ``{"step": s, ...}`` row as a scalar."""
    from tensorboardX import SummaryWriter

    staging = tempfile.mkdtemp(prefix=".tb-", dir=os.path.dirname(path))
    try:
        writer = SummaryWriter(logdir=staging, flush_secs=3600)
        for row in rows:
            for tag, value in row.items():
                if tag != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(tag, float(value), int(row["step"]), walltime=wall_time)
        writer.close()
        (written,) = glob.glob(os.path.join(staging, "events.out.tfevents.*"))
        os.replace(written, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_run(run_dir: str) -> str | None:
    """``RUN_DIR/tensorboard/<event file>`` from ``RUN_DIR/metrics.jsonl``; None when there are no metrics."""
    rows = rd.read_metrics(run_dir)
    if not rows:
        return None
    os.makedirs(os.path.join(run_dir, rd.TENSORBOARD_DIR), exist_ok=True)
    out = os.path.join(run_dir, rd.TENSORBOARD_DIR, EVENT_FILE)
    write_scalars(out, rows, wall_time=os.path.getmtime(os.path.join(run_dir, rd.METRICS_FILE)))
    return out
