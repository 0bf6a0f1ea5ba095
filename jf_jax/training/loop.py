"""The host training loop: data, model, optimizer, mesh, checkpoints, metrics (run-dir layout:
``jf_jax.weights.run_dir``).

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
* Sequences longer than the largest length bucket are left out; their number is printed when training starts
  (``TrainResult.num_dropped``), and a run where they would be more than ``data.max_dropped_share`` of the data
  stops with ``DroppedSequencesError`` before anything is trained.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Callable, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
import yaml
from tqdm.auto import tqdm

from jf_jax.weights import run_dir as rd
from jf_jax.training import tensorboard
from jf_jax.model.config import ModelConfig
from jf_jax.training.packing import BatchStream, bucket_for, example_from_records, pack_example
from jf_jax.model.params import abstract_params, init_params
from jf_jax.model.sharding import ShardingRules, make_mesh, tensor_split_problem
from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
from jf_jax.training.config import ConfigKeyError, TrainConfig, config_from_dict
from jf_jax.training.state import TrainState, abstract_state, init_state, make_optimizer, state_shardings
from jf_jax.training.step import make_train_step, put_batch, reference_params
from jf_jax.training.trajectories import collect, load_responses, read_manifest, trajectory_dirs


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped and kept its last good checkpoint."""


class DroppedSequencesError(ValueError):
    """More of the training sequences than ``data.max_dropped_share`` are longer than the largest length bucket."""


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


@functools.lru_cache(maxsize=1)
def _pretrained(spec: str):
    from jf_jax import weights

    return weights.load(spec, dtype="float32")


def model_config(tcfg: TrainConfig) -> ModelConfig:
    """The model's config with the training overrides of ``model.compute_dtype`` (master weights stay float32),
    ``model.remat``, ``model.attention_impl`` and ``model.attention_backward``."""
    if tcfg.model.source == "random":
        cfg = ModelConfig.from_dict(tcfg.model.config)
    elif tcfg.model.source == "pretrained":
        cfg = _pretrained(tcfg.model.path).cfg
    else:
        cfg = rd.load_model_config(tcfg.model.path)
    if tcfg.model.compute_dtype is not None:
        cfg = cfg.replace(dtype=tcfg.model.compute_dtype, param_dtype="float32")
    for name in ("remat", "attention_impl", "attention_backward"):
        if getattr(tcfg.model, name) is not None:
            cfg = cfg.replace(**{name: getattr(tcfg.model, name)})
    return cfg


def base_model_spec(tcfg: TrainConfig) -> str | None:
    """The pretrained spec the run descends from (its tokenizer), or None for random init."""
    if tcfg.model.source == "pretrained":
        spec = tcfg.model.path
        return os.path.abspath(spec) if os.path.exists(spec) else spec
    if tcfg.model.source == "run":
        return rd.load_base_model(tcfg.model.path)
    return None


def initial_params(tcfg: TrainConfig, cfg: ModelConfig) -> dict:
    """Random params (jitted init, seeded by ``tcfg.seed``), the pretrained weights of the spec ``model.path``, or
    the params of the run dir ``model.path``."""
    if tcfg.model.source == "random":
        return jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(tcfg.seed))
    if tcfg.model.source == "pretrained":
        params = _pretrained(tcfg.model.path).params
        _pretrained.cache_clear()  # the caller copies them onto the mesh; do not keep a second copy alive
        return params
    return rd.load_run(tcfg.model.path)[1]


def _primary() -> bool:
    """Whether this process writes the run's files (process 0 of a ``jax.distributed`` run; the only one
    otherwise). Orbax checkpoints are written by every process together."""
    return jax.process_index() == 0


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def build_stream(tcfg: TrainConfig, run_dir: str, vocab_size: int, progress: bool = True) -> BatchStream:
    """Every process builds the same global batches (deterministic from the data and the seed); ``put_batch``
    then places each row on the devices of its data-parallel shard."""
    d = tcfg.data
    paths = (d.path,) if isinstance(d.path, str) else tuple(d.path or ())
    if d.source == "synthetic":
        s = d.synthetic
        paths = (os.path.join(run_dir, rd.TRAJECTORY_DIR),)
        prompts = make_prompts(s.num_prompts, s.prompt_len, s.vocab_size, seed=d.seed)
        if _primary():
            collect(prompts, SyntheticRecorder(d.block_size, s.num_blocks, s.vocab_size), paths[0],
                    block_size=d.block_size, progress=progress, metadata={"source": "synthetic"})
        _barrier("jf_jax synthetic trajectories")
    responses = []
    for path in [d for p in paths for d in trajectory_dirs(p)]:
        block_size = read_manifest(path)["block_size"]
        if block_size != d.block_size:
            raise ConfigKeyError(f"data.block_size={d.block_size} but {path} holds blocks of {block_size}")
        responses += load_responses(path)
    rng = np.random.default_rng([d.seed, 1])  # only the random schedule draws from it
    sequences = [pack_example(example_from_records(recs, d.window, d.schedule, rng), eos_id=d.eos_id,
                              pad_id=d.pad_id, train_prompt=tcfg.loss.train_prompt)
                 for recs in responses]
    top = max(int(s.tokens.max()) for s in sequences)
    if top >= vocab_size:
        raise ValueError(f"trajectories in {', '.join(paths)} hold token id {top}, outside the model vocabulary "
                         f"({vocab_size})")
    check_dropped([len(s) for s in sequences], d.buckets, d.max_dropped_share)
    return BatchStream(sequences, batch_size=d.batch_size, buckets=d.buckets, pad_id=d.pad_id, seed=d.seed,
                       pack_rows=d.pack_rows, teacher_tokens=tcfg.loss.teacher_tokens)


def check_dropped(lengths: Sequence[int], buckets: Sequence[int], max_share: float) -> int:
    """The number of sequences (of these token ``lengths``) longer than the largest bucket, which ``BatchStream``
    leaves out; raises ``DroppedSequencesError`` when they are more than ``max_share`` of all."""
    if not 0.0 <= max_share <= 1.0:
        raise ConfigKeyError(f"data.max_dropped_share must be between 0 and 1, got {max_share}")
    largest = max(buckets)
    dropped = sum(bucket_for(n, buckets) is None for n in lengths)  # BatchStream's own rule
    share = dropped / len(lengths) if lengths else 0.0
    if share > max_share:
        longest = max(lengths)
        raise DroppedSequencesError(
            f"{dropped} of {len(lengths)} training sequences ({share:.1%}) are longer than the largest length bucket, "
            f"{largest} tokens (data.buckets={list(buckets)}; the longest sequence has {longest} tokens), and would "
            f"be dropped: more than data.max_dropped_share={max_share:g} ({max_share:.1%}) allows. Add a bucket "
            f"that holds them (e.g. data.buckets={sorted(buckets) + [longest]}) or raise data.max_dropped_share to "
            f"train without them.")
    return dropped


def teacher_params(tcfg: TrainConfig, cfg: ModelConfig, initial: dict) -> dict:
    """The frozen parameters ``loss.ar_teacher=reference`` distils from, as ``step.reference_params`` stores
    them: ``initial`` (the run's initial weights) or the model ``loss.ar_reference`` names, which must have the
    trained model's architecture."""
    spec = tcfg.loss.ar_reference
    if spec is None:
        return reference_params(initial, cfg)
    from jf_jax import weights

    kind, source, _ = weights.resolve(spec)
    if kind == "run":  # its parameters only: a run from random init has no tokenizer, and needs none here
        ref_cfg, params = rd.load_run(source)
    else:
        loaded = weights.load(spec, dtype="float32")
        ref_cfg, params = loaded.cfg, loaded.params
    shapes = [jax.tree.map(lambda x: tuple(x.shape), p) for p in (initial, params)]
    if jax.tree.structure(shapes[0]) != jax.tree.structure(shapes[1]) or shapes[0] != shapes[1]:
        raise ConfigKeyError(f"loss.ar_reference={spec!r} does not have the trained model's architecture "
                             f"({ref_cfg.num_layers} layers, hidden size {ref_cfg.hidden_size}, vocabulary "
                             f"{ref_cfg.vocab_size}, against {cfg.num_layers}, {cfg.hidden_size}, {cfg.vocab_size})")
    return reference_params(params, cfg)


NOT_COMPARED = (("data", "max_dropped_share"),)
"""Config keys that do not change what a run computes: a run resumes with other values of them."""
NOT_COMPARED_SECTIONS = ("mesh",)
"""Config sections that do not change what a run computes: ``mesh`` places the state and the batches on devices,
and a checkpoint written on one mesh is resharded onto another by the restore."""
MESH_HISTORY_FILE = "mesh_history.jsonl"
"""In the run dir: one line per start or resume of the run, ``{"step": s, "mesh": {...}, "devices": n}``, the step it
began at (its checkpoint, 0 for a new run) and the mesh it ran on."""


def _compared(config: dict) -> dict:
    config = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items() if k not in NOT_COMPARED_SECTIONS}
    for section, key in NOT_COMPARED:
        if isinstance(config.get(section), dict):
            config[section].pop(key, None)
    return config


def _check_config(tcfg: TrainConfig, run_dir: str) -> bool:
    """Refuses to resume the run in ``run_dir`` with a config that computes something else; returns whether the
    snapshot is still to be written (a new run, or one resumed with other values of ``NOT_COMPARED`` keys or of
    the ``NOT_COMPARED_SECTIONS``, e.g. on another mesh)."""
    path = os.path.join(run_dir, rd.CONFIG_FILE)
    current = tcfg.to_dict()
    if not os.path.exists(path):
        return True
    with open(path) as f:
        previous = yaml.safe_load(f)
    try:  # a snapshot written before a field was added reads with that field's default
        previous = config_from_dict(previous).to_dict()
    except ConfigKeyError:
        pass
    if _compared(previous) != _compared(current):
        raise ConfigKeyError(f"{run_dir} holds a run with a different config ({path}); resuming it with another "
                             "config would not reproduce it. Use a new run directory.")
    return previous != current


def _write_config(tcfg: TrainConfig, run_dir: str) -> None:
    path = os.path.join(run_dir, rd.CONFIG_FILE)
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(tcfg.to_dict(), f, sort_keys=False)
    os.replace(path + ".tmp", path)  # never half a snapshot: a run killed here resumes or restarts cleanly


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


def run_training(tcfg: TrainConfig, run_dir: str, *, progress: bool = True, stop_at_step: int | None = None,
                 stop_after_s: float | None = None, export_on_stop: bool = False,
                 on_step: Callable[[int, dict], None] | None = None, devices=None,
                 rules: ShardingRules = ShardingRules()) -> TrainResult:
    """Trains (or resumes) the run in ``run_dir`` up to ``tcfg.train.steps`` (or ``stop_at_step``).

    ``stop_after_s``: stop after the first step that ends this many seconds after the training loop started
    (a lease or a session with a fixed end; checkpointed there, so the same command resumes). With
    ``export_on_stop`` an early stop also exports that step's weights to ``params/`` so the run can be evaluated
    before it finishes; finishing later replaces them. on_step(step, metrics) is called after each finished,
    checked and checkpointed step.
    """
    os.makedirs(run_dir, exist_ok=True)
    write_config = _check_config(tcfg, run_dir)
    _barrier("jf_jax config checked")  # a changed config is refused by every process before any is written over
    cfg = model_config(tcfg)
    mesh = make_mesh(tcfg.mesh.data, tcfg.mesh.fsdp, devices, tensor=tcfg.mesh.tensor)
    split = tensor_split_problem(cfg, tcfg.mesh.tensor)
    if split:  # before the data and the weights load
        raise ConfigKeyError(f"mesh.tensor: {split}")
    primary = _primary()
    if primary:
        rd.save_model_config(run_dir, cfg)
        rd.save_base_model(run_dir, base_model_spec(tcfg))
    # Before the config snapshot: a new run refused for its data can be started again with other buckets.
    stream = build_stream(tcfg, run_dir, cfg.vocab_size, progress and primary)
    if primary:
        if write_config:
            _write_config(tcfg, run_dir)
        kept, dropped = len(stream.sequences), stream.num_dropped
        print(f"{tcfg.run_name}: {kept} training sequences; {dropped} ({dropped / (kept + dropped):.1%}) longer than "
              f"the largest length bucket ({max(tcfg.data.buckets)} tokens) left out (data.max_dropped_share="
              f"{tcfg.data.max_dropped_share:g})", flush=True)

    total = tcfg.train.steps
    optimizer = make_optimizer(cfg, tcfg.optim, total)
    shardings = state_shardings(cfg, optimizer, abstract_params(cfg), mesh, rules)
    initial = None
    reference = None
    if tcfg.loss.ar_teacher == "reference":
        # Frozen: the run's initial weights or loss.ar_reference; rebuilt from the config on resume (not checkpointed).
        initial = initial_params(tcfg, cfg)
        reference = jax.device_put(teacher_params(tcfg, cfg, initial), shardings.params)
    step_fn = make_train_step(cfg, tcfg.loss, tcfg.optim, total, mesh, rules, shardings, reference)

    ckpt_dir = os.path.abspath(os.path.join(run_dir, rd.CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=tcfg.train.keep_checkpoints,
                                           save_interval_steps=tcfg.train.ckpt_every,
                                           enable_async_checkpointing=False, create=True)
    metrics_path = os.path.join(run_dir, rd.METRICS_FILE)
    results: dict[int, dict[str, float]] = {}
    with ocp.CheckpointManager(ckpt_dir, options=options) as mngr:
        latest = mngr.latest_step()
        if latest is None:
            params = jax.device_put(initial_params(tcfg, cfg) if initial is None else initial, shardings.params)
            state = jax.jit(lambda p: init_state(p, optimizer), out_shardings=shardings)(params)
        else:
            target = _to_tree(abstract_state(cfg, optimizer, abstract_params(cfg), shardings))
            tree = mngr.restore(latest, args=ocp.args.StandardRestore(target))
            state = TrainState(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])
        del initial  # the host copy of the initial weights is not kept through the run (the reference lives on)
        start = int(state.step)
        if primary:
            _truncate_metrics(metrics_path, start)
            _record_mesh(run_dir, tcfg, mesh, start)
        end = total if stop_at_step is None else min(total, stop_at_step)
        bar = tqdm(total=total, initial=start, desc=tcfg.run_name, unit="step", disable=not (progress and primary))
        started = time.monotonic()
        with open(metrics_path if primary else os.devnull, "ab", buffering=0) as metrics_file:
            for step in range(start, end):
                state, metrics = step_fn(state, put_batch(stream.batch(step), mesh, rules))
                m = {k: float(v) for k, v in jax.device_get(metrics).items()}
                done = step + 1
                if not all(math.isfinite(m[k]) for k in ("loss/total", "loss/ar", "loss/consistency")):
                    metrics_file.close()
                    if primary:
                        write_reports(run_dir)
                    raise NonFiniteLossError(
                        f"non-finite loss at step {done} (loss/total={m['loss/total']}, loss/ar={m['loss/ar']}, "
                        f"loss/consistency={m['loss/consistency']}, grad_norm={m['learning/grad_norm']}); "
                        f"stopped without saving it. Last good checkpoint: step {mngr.latest_step()} in "
                        f"{ckpt_dir}. Lower the learning rate or inspect the batch of step {done}.")
                if done % tcfg.train.log_every == 0 or done == total:
                    _append_metrics(metrics_file, {"step": done, **m})
                out_of_time = stop_after_s is not None and time.monotonic() - started >= stop_after_s
                mngr.save(done, args=ocp.args.StandardSave(_to_tree(state)), force=done == total or out_of_time)
                if done % tcfg.train.ckpt_every == 0 and primary:
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
            rd.export_params(run_dir, cfg, _host_params(state.params))
    if primary:
        write_reports(run_dir)
    return TrainResult(run_dir=run_dir, step=final_step, metrics=results, num_sequences=len(stream.sequences),
                       num_dropped=stream.num_dropped)
