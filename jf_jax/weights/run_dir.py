"""The layout of a training run directory, and reading a trained model back from it.

::

    RUN_DIR/config.yaml          the TrainConfig of the run (after key=value overrides)
    RUN_DIR/model_config.json    ModelConfig.to_dict() of the trained model
    RUN_DIR/metrics.jsonl        one JSON object per logged step: {"step": s, "loss/total": ..., ...}
    RUN_DIR/loss_curve.png       loss curves drawn from metrics.jsonl
    RUN_DIR/tensorboard/         a TensorBoard event file of the same metrics (``jf_jax.training.tensorboard``)
    RUN_DIR/checkpoints/<step>/  orbax CheckpointManager steps: the whole TrainState (step, params, opt_state)
    RUN_DIR/params/              orbax StandardSave of the final parameters (the ``jf_jax.model.params`` tree)
    RUN_DIR/trajectories/        trajectories collected by the run itself (synthetic data source only)
    RUN_DIR/mesh_history.jsonl   one line per start or resume: the checkpoint step and the device mesh it ran on
    RUN_DIR/base_model.json      {"spec": ...}: the ``jf_jax.weights.load`` spec of the pretrained model the run
                                 started from (directly, or through the run it continued); its tokenizer is the
                                 run's tokenizer. Absent for runs from random init.

``load_run(RUN_DIR)`` returns ``(ModelConfig, params)`` from ``model_config.json`` and ``params/``;
``jf_jax.weights.load(RUN_DIR)`` adds the base model's tokenizer, which is what ``python -m jf_jax.decode --model
RUN_DIR`` loads.
"""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, abstract_params, check_params

CONFIG_FILE = "config.yaml"
MODEL_CONFIG_FILE = "model_config.json"
METRICS_FILE = "metrics.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
PARAMS_DIR = "params"
TRAJECTORY_DIR = "trajectories"
BASE_MODEL_FILE = "base_model.json"


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MODEL_CONFIG_FILE)) and os.path.isdir(os.path.join(path, PARAMS_DIR))


def save_base_model(run_dir: str, spec: str | None) -> None:
    """Records the pretrained model spec the run descends from (nothing for random init)."""
    if spec is not None:
        with open(os.path.join(run_dir, BASE_MODEL_FILE), "w") as f:
            json.dump({"spec": spec}, f)


def load_base_model(run_dir: str) -> str | None:
    path = os.path.join(run_dir, BASE_MODEL_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["spec"]


def read_metrics(run_dir: str) -> list[dict]:
    """The rows of ``metrics.jsonl`` (empty when the run has logged nothing yet). Text after the last newline is a
    line a killed run did not finish: it is not a row (the run's resume drops it from the file)."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        *lines, _unfinished = f.read().split("\n")
    return [json.loads(ln) for ln in lines if ln.strip()]


def save_model_config(run_dir: str, cfg: ModelConfig) -> None:
    with open(os.path.join(run_dir, MODEL_CONFIG_FILE), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1)


def load_model_config(run_dir: str) -> ModelConfig:
    with open(os.path.join(run_dir, MODEL_CONFIG_FILE)) as f:
        return ModelConfig.from_dict(json.load(f))


def export_params(run_dir: str, cfg: ModelConfig, params: Params) -> str:
    """Writes ``params/`` (replacing an older export) and ``model_config.json``; returns the params path."""
    path = os.path.abspath(os.path.join(run_dir, PARAMS_DIR))
    save_model_config(run_dir, cfg)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params, force=True)
        ckptr.wait_until_finished()
    return path


def load_run(run_dir: str, sharding=None) -> tuple[ModelConfig, Params]:
    """(ModelConfig, params) of a run directory; ``sharding`` (one Sharding for all leaves) defaults to the
    first local device."""
    cfg = load_model_config(run_dir)
    path = os.path.abspath(os.path.join(run_dir, PARAMS_DIR))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{run_dir} has no exported {PARAMS_DIR}/ (did the run finish?)")
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), abstract_params(cfg))
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(path, target)
    check_params(cfg, params, source=f"params in {path}")
    return cfg, params
