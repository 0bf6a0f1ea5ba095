"""Running a training run that ``setup.prepare_run`` set up: steps, checkpoints, metrics, mesh history, reports
(run-dir layout: ``jf_jax.weights.run_dir``).

* Exact resume: the state (step, params, optimizer state) is checkpointed with an orbax CheckpointManager
  (atomic: written to a temporary directory and renamed; keep-N). Batches are a pure function of
  (data seed, step) (``packing.BatchStream``) and the step uses no device randomness, so a run killed at any
  point and restarted with the same run dir replays the same batches from the last checkpoint and produces
  the same losses as an uninterrupted run. Metrics lines logged after that checkpoint are dropped on resume,
  and so is a last line cut short by the kill.
* Metrics go to ``metrics.jsonl`` every ``log_every`` steps; ``loss_curve.png`` and a TensorBoard event file
  (``tensorboard --logdir RUN_DIR/tensorboard``) are redrawn from it.
* A non-finite loss stops the run with ``NonFiniteLossError`` before anything of that step is saved: the
  newest checkpoint stays the last good one.
* The ``mesh`` section decides where the state lives, not what is computed: a run may resume on another mesh (the
  checkpoint is resharded onto it by the restore) and continues the same loss curve, to float rounding (reductions
  partitioned over other devices round differently). Every start or resume appends the step it began at and the
  mesh it ran on to ``mesh_history.jsonl`` in the run dir; ``config.yaml`` holds the newest mesh.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

from jf_jax.model.params import Params, abstract_params
from jf_jax.model.sharding import ShardingRules
from jf_jax.training import tensorboard
from jf_jax.training.config import TrainConfig
from jf_jax.training.setup import PreparedRun, prepare_run
from jf_jax.training.state import TrainState, abstract_state, init_state
from jf_jax.training.step import make_train_step, put_batch
from jf_jax.weights import run_dir as rd


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped and kept its last good checkpoint."""


@dataclasses.dataclass
class TrainResult:
    run_dir: str
    step: int
    """Completed steps when the loop returned."""
    metrics: dict[int, dict[str, float]]
    """Metrics of every step run by this call, keyed by the step count after it (1-based)."""
    num_sequences: int
    """Sequences trained on (those that fit the largest length bucket)."""
    num_dropped: int = 0
    """Sequences left out: longer than the largest length bucket."""


MESH_HISTORY_FILE = "mesh_history.jsonl"
"""In the run dir: one line per start or resume of the run, ``{"step": s, "mesh": {...}, "devices": n}``, the step it
began at (its checkpoint, 0 for a new run) and the mesh it ran on."""


def _record_mesh(run_dir: str, tcfg: TrainConfig, mesh, start: int) -> None:
    """Appends the mesh this start or resume runs on to the run's mesh history, and says so when it is not the mesh
    of the segment before. A last line cut short by a kill is dropped first (as in metrics.jsonl)."""
    path = os.path.join(run_dir, MESH_HISTORY_FILE)
    shape = {axis: int(size) for axis, size in mesh.shape.items()}
    lines: list[bytes] = []
    if os.path.exists(path):
        with open(path, "rb") as f:
            *lines, partial = f.read().split(b"\n")
        lines = [line for line in lines if line.strip()]
        if partial.strip():
            with open(path + ".tmp", "wb") as f:
                f.writelines(line + b"\n" for line in lines)
            os.replace(path + ".tmp", path)
    previous = json.loads(lines[-1])["mesh"] if lines else None
    if previous is not None and previous != shape:
        print(f"{tcfg.run_name}: resuming at step {start} on mesh {_mesh_text(shape)} (the run was on "
              f"{_mesh_text(previous)}): the checkpoint is resharded onto it", flush=True)
    with open(path, "ab", buffering=0) as f:
        _append_metrics(f, {"step": start, "mesh": shape, "devices": int(mesh.devices.size)})


def _mesh_text(shape: dict) -> str:
    return " x ".join(f"{axis}={size}" for axis, size in shape.items())


def _truncate_metrics(path: str, last_step: int) -> None:
    """Keeps the lines of steps up to ``last_step`` (the checkpoint resumed from). Text after the last newline is a
    line cut short by a kill mid-write: it is dropped, with a warning (its step is run and logged again)."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        *lines, partial = f.read().split(b"\n")
    if partial.strip():
        print(f"warning: {path}: dropped its unfinished last line ({len(partial)} bytes, no newline)", file=sys.stderr)
    kept = [line + b"\n" for line in lines if line.strip() and json.loads(line)["step"] <= last_step]
    with open(path + ".tmp", "wb") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)  # a kill here leaves the old file, truncated again on the next resume


def _append_metrics(f, row: dict) -> None:
    """Appends ``row`` as one line to ``f`` (unbuffered, opened for appending): each line goes to the OS as it is
    written, so a kill leaves whole lines and at most the last one cut short, which resume drops."""
    data = (json.dumps(row) + "\n").encode()
    while data:
        data = data[f.write(data):]


def plot_metrics(run_dir: str) -> str | None:
    """Draws loss/total, loss/ar and loss/consistency from metrics.jsonl into loss_curve.png (with a moving mean
    over ~1/30 of the run)."""
    rows = rd.read_metrics(run_dir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("loss/total", "loss/ar", "loss/consistency")
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3))
    steps = [r["step"] for r in rows]
    window = max(1, len(rows) // 30)  # per-step losses of batch-1 runs are noisy: overlay a moving mean
    for ax, key in zip(axes, keys):
        values = np.array([r.get(key, math.nan) for r in rows], np.float64)
        ax.plot(steps, values, color="tab:blue", alpha=0.35 if window > 1 else 1.0, lw=0.8)
        if window > 1:
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, color="tab:blue", lw=1.8, label=f"mean of {window} steps")
            ax.legend(fontsize=8)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = os.path.join(run_dir, rd.LOSS_CURVE_FILE)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_reports(run_dir: str) -> None:
    """loss_curve.png and the TensorBoard event file, both redrawn from metrics.jsonl."""
    plot_metrics(run_dir)
    tensorboard.export_run(run_dir)


def _host_params(params):
    """Full host copies of (possibly multi-process sharded) parameters, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(params)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(params, tiled=True)


def _to_tree(state: TrainState) -> dict:
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}


def _start_state(run: PreparedRun, mngr: ocp.CheckpointManager, initial: Params | None) -> TrainState:
    """The newest checkpoint's state, resharded onto ``run.mesh``; for a new run, the initial weights (``initial``
    when the set-up loaded them already) with a fresh optimizer state."""
    latest = mngr.latest_step()
    if latest is None:
        params = jax.device_put(run.model.params(run.cfg) if initial is None else initial, run.shardings.params)
        return jax.jit(lambda p: init_state(p, run.optimizer), out_shardings=run.shardings)(params)
    target = _to_tree(abstract_state(run.cfg, run.optimizer, abstract_params(run.cfg), run.shardings))
    tree = mngr.restore(latest, args=ocp.args.StandardRestore(target))
    return TrainState(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])


def run_training(tcfg: TrainConfig, run_dir: str, *, progress: bool = True, stop_at_step: int | None = None,
                 stop_after_s: float | None = None, export_on_stop: bool = False,
                 on_step: Callable[[int, dict], None] | None = None, devices=None,
                 rules: ShardingRules = ShardingRules()) -> TrainResult:
    """Trains (or resumes) the run in ``run_dir`` up to ``train.steps`` (or ``stop_at_step``); the config is read
    by ``setup.prepare_run`` alone.

    ``stop_after_s``: stop after the first step that ends this many seconds after the training loop started
    (a lease or a session with a fixed end; checkpointed there, so the same command resumes). With
    ``export_on_stop`` an early stop also exports that step's weights to ``params/`` so the run can be evaluated
    before it finishes; finishing later replaces them. on_step(step, metrics) is called after each finished,
    checked and checkpointed step.
    """
    run, initial = prepare_run(tcfg, run_dir, progress=progress, devices=devices, rules=rules)
    total = run.train.steps
    step_fn = make_train_step(run.cfg, run.loss, run.optim, total, run.mesh, run.rules, run.shardings, run.reference)

    ckpt_dir = os.path.abspath(os.path.join(run_dir, rd.CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=run.train.keep_checkpoints,
                                           save_interval_steps=run.train.ckpt_every,
                                           enable_async_checkpointing=False, create=True)
    metrics_path = os.path.join(run_dir, rd.METRICS_FILE)
    results: dict[int, dict[str, float]] = {}
    with ocp.CheckpointManager(ckpt_dir, options=options) as mngr:
        state = _start_state(run, mngr, initial)
        del initial  # the host copy of the initial weights is not kept through the run (the reference lives on)
        start = int(state.step)
        if run.primary:
            _truncate_metrics(metrics_path, start)
            _record_mesh(run_dir, tcfg, run.mesh, start)
        end = total if stop_at_step is None else min(total, stop_at_step)
        bar = tqdm(total=total, initial=start, desc=run.name, unit="step", disable=not (progress and run.primary))
        started = time.monotonic()
        with open(metrics_path if run.primary else os.devnull, "ab", buffering=0) as metrics_file:
            for step in range(start, end):
                state, metrics = step_fn(state, put_batch(run.stream.batch(step), run.mesh, run.rules))
                m = {k: float(v) for k, v in jax.device_get(metrics).items()}
                done = step + 1
                if not all(math.isfinite(m[k]) for k in ("loss/total", "loss/ar", "loss/consistency")):
                    metrics_file.close()
                    if run.primary:
                        write_reports(run_dir)
                    raise NonFiniteLossError(
                        f"non-finite loss at step {done} (loss/total={m['loss/total']}, loss/ar={m['loss/ar']}, "
                        f"loss/consistency={m['loss/consistency']}, grad_norm={m['learning/grad_norm']}); "
                        f"stopped without saving it. Last good checkpoint: step {mngr.latest_step()} in "
                        f"{ckpt_dir}. Lower the learning rate or inspect the batch of step {done}.")
                if done % run.train.log_every == 0 or done == total:
                    _append_metrics(metrics_file, {"step": done, **m})
                out_of_time = stop_after_s is not None and time.monotonic() - started >= stop_after_s
                mngr.save(done, args=ocp.args.StandardSave(_to_tree(state)), force=done == total or out_of_time)
                if done % run.train.ckpt_every == 0 and run.primary:
                    tensorboard.export_run(run_dir)  # live view
                results[done] = m
                bar.update(1)
                bar.set_postfix(loss=f"{m['loss/total']:.4f}")
                if on_step is not None:
                    on_step(done, m)
                if out_of_time:
                    break
        bar.close()
        mngr.wait_until_finished()
        final_step = int(state.step)
        if final_step == total or (export_on_stop and final_step > start):
            rd.export_params(run_dir, run.cfg, _host_params(state.params))
    if run.primary:
        write_reports(run_dir)
    return TrainResult(run_dir=run_dir, step=final_step, metrics=results, num_sequences=len(run.stream.sequences),
                       num_dropped=run.stream.num_dropped)
