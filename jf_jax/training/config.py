"""Training configuration: frozen dataclasses loaded from ``configs/*.yaml`` plus ``key=value`` overrides.

A file may extend others: ``base: recipe.yaml`` (or a list of files, applied in order; paths relative to the
file) is read first and the file's own keys are merged over it, mappings key by key, any other value replacing
the base's. So a run's config holds only what differs from the recipe it extends; the resolved configuration is
what training writes into the run directory (``config.yaml``).

Unknown keys (in the YAML or in an override) are rejected with their dotted path, e.g.
``unknown config key 'data.bukets' (known keys of data: ...)``. Override values are parsed as YAML scalars
(``optim.learning_rate=3e-4``, ``data.buckets=[128,256]``, ``model.path=null``). Every such fault is a
``ConfigKeyError`` with a one-line message; ``check_before_training`` adds those that need more than the config
(``model.config``'s fields, the block size of the trajectories), so a command can refuse them before any work.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Any, Mapping, Sequence

import yaml

from jf_jax.model.config import ATTENTION_BACKWARDS, ATTENTION_IMPLS, ConfigError, ModelConfig
from jf_jax.training.losses import LossConfig
from jf_jax.training.noise_schedule import SCHEDULES
from jf_jax.training.state import OptimConfig
from jf_jax.training.trajectories import read_manifest, trajectory_dirs

MODEL_SOURCES = ("random", "run", "pretrained")
DATA_SOURCES = ("trajectories", "synthetic")


class ConfigKeyError(ValueError):
    """A configuration file or override names a key that does not exist, or a value of the wrong type."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    source: str = "random"
    """"random" (init from ``config`` and the run seed), "run" (params of a finished run dir at ``path``) or
    "pretrained" (``path`` is a ``jf_jax.weights.load`` spec: "smollm2-135m", a .gguf file or a HF directory)."""
    path: str | None = None
    config: dict | None = None
    """ModelConfig fields (``jf_jax.model.config.ModelConfig``) for ``source: random``."""
    compute_dtype: str | None = None
    """Overrides the model's compute dtype for training ("bfloat16": bf16 matmuls forward and backward with float32
    master weights, optimizer state and loss); None keeps the model's."""
    remat: bool | None = None
    """Overrides ``ModelConfig.remat`` (recompute layer activations in the backward); None keeps the model's."""
    attention_impl: str | None = None
    """Overrides ``ModelConfig.attention_impl`` (training attention: auto, reference, pallas, pallas_triton,
    pallas_tpu); None keeps the model's ("auto": the Pallas kernel on a TPU or GPU, the reference on a CPU)."""
    attention_backward: str | None = None
    """Overrides ``ModelConfig.attention_backward`` ("fused" kernels, or "reference": autodiff of the plain-JAX
    attention, the fallback should a fused backward not compile on a device); None keeps the model's."""

    def __post_init__(self):
        if self.source not in MODEL_SOURCES:
            raise ConfigKeyError(f"model.source must be one of {MODEL_SOURCES}, got {self.source!r}")
        if self.source == "random" and not self.config:
            raise ConfigKeyError("model.source=random needs model.config (ModelConfig fields)")
        if self.source == "run" and not self.path:
            raise ConfigKeyError("model.source=run needs model.path (a training run directory)")
        if self.compute_dtype not in (None, "float32", "bfloat16"):
            raise ConfigKeyError(f"model.compute_dtype must be float32 or bfloat16, got {self.compute_dtype!r}")
        for name, allowed in (("attention_impl", ATTENTION_IMPLS), ("attention_backward", ATTENTION_BACKWARDS)):
            if getattr(self, name) not in (None, *allowed):
                raise ConfigKeyError(f"model.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.source == "pretrained" and not self.path:
            raise ConfigKeyError("model.source=pretrained needs model.path (e.g. smollm2-135m, a .gguf, a HF dir)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticSection:
    """A synthetic next-token task with fake Jacobi trajectories (``jf_jax.training.synthetic``), for smoke runs."""

    num_prompts: int = 64
    prompt_len: int = 8
    num_blocks: int = 4
    vocab_size: int = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    source: str = "trajectories"
    path: str | tuple[str, ...] | None = None
    """Trajectory directory (``jf_jax.training.trajectories``) for ``source: trajectories``, or a list of them (e.g. the
    outputs of parallel collection workers); their responses are concatenated in list order."""
    block_size: int = 16
    window: int = 16
    schedule: str = "progressive"
    eos_id: int | None = None
    pad_id: int = 0
    batch_size: int = 1
    buckets: tuple[int, ...] = (256, 512, 1024)
    max_dropped_share: float = 0.01
    """Sequences longer than the largest bucket are left out of training (their number is reported when training
    starts); a run refuses to start when more than this share of them (0.01: 1%) would be."""
    pack_rows: bool = False
    """Pack several sequences into one row (segments) instead of one sequence per padded row."""
    seed: int = 0
    """Seeds the data order and the random noise schedule."""
    synthetic: SyntheticSection = SyntheticSection()

    @property
    def paths(self) -> tuple[str, ...]:
        """``path`` as a tuple of directories (one, a list, or none)."""
        return (self.path,) if isinstance(self.path, str) else tuple(self.path or ())

    def __post_init__(self):
        if self.source not in DATA_SOURCES:
            raise ConfigKeyError(f"data.source must be one of {DATA_SOURCES}, got {self.source!r}")
        if self.source == "trajectories" and not self.path:
            raise ConfigKeyError("data.source=trajectories needs data.path")
        if self.schedule not in SCHEDULES:
            raise ConfigKeyError(f"data.schedule must be one of {SCHEDULES}, got {self.schedule!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSection:
    steps: int = 100
    ckpt_every: int = 50
    keep_checkpoints: int = 3
    log_every: int = 1
    """Metrics are written to JSONL every ``log_every`` steps (losses are checked for NaN every step)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshSection:
    data: int = 1
    fsdp: int = -1
    """-1: all devices not used by ``data`` and ``tensor``."""
    tensor: int = 1
    """Devices that split each layer's heads, MLP units and vocabulary (``model.sharding``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_name: str = "run"
    seed: int = 0
    """Seeds random parameter init."""
    model: ModelSection
    data: DataSection
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    train: LoopSection = LoopSection()
    mesh: MeshSection = MeshSection()

    def to_dict(self) -> dict:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(x):
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


def _convert(tp, value, path: str):
    """Checks/coerces ``value`` to the annotated type ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, path)
            except ConfigKeyError as e:
                errors.append(str(e))
        raise ConfigKeyError(errors[0] if errors else f"{path}: bad value {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigKeyError(f"{path} must be a mapping, got {value!r}")
        return _build(tp, value, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigKeyError(f"{path} must be a list, got {value!r}")
        return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigKeyError(f"{path} must be a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigKeyError(f"{path} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigKeyError(f"{path} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigKeyError(f"{path} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigKeyError(f"{path} must be a string, got {value!r}")
        return value
    raise ConfigKeyError(f"{path}: unsupported field type {tp}")


def _build(cls, data: Mapping[str, Any], path: str = ""):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            where = f"{path}.{key}" if path else key
            raise ConfigKeyError(f"unknown config key {where!r} (known keys of {path or 'the top level'}: "
                                 f"{', '.join(fields)})")
    kwargs = {k: _convert(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigKeyError(f"{path or 'config'}: {e}") from None
    except ValueError as e:
        if isinstance(e, ConfigKeyError):
            raise
        raise ConfigKeyError(f"{path or 'config'}: {e}") from None


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Applies ``a.b.c=value`` strings to a nested dict (values parsed as YAML)."""
    data = _to_plain(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigKeyError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        node, parts = data, key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigKeyError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_yaml(raw, f"override {item!r}")
    return data


def _parse_yaml(text, where: str):
    """``yaml.safe_load`` with its multi-line syntax errors turned into a one-line ``ConfigKeyError``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigKeyError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None


def config_from_dict(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> TrainConfig:
    return _build(TrainConfig, apply_overrides(dict(data), overrides))


BASE_KEY = "base"


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    """``over`` merged onto ``base``: mappings key by key (recursively), any other value replaces the base's."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_config_file(path: str, _chain: tuple[str, ...] = ()) -> dict:
    """The mapping of a config file with its ``base`` files merged under it (not yet checked against the schema)."""
    real = os.path.realpath(path)
    if real in _chain:
        raise ConfigKeyError(f"{path}: the '{BASE_KEY}' chain loops: " + " -> ".join(_chain + (real,)))
    try:
        with open(path) as f:
            data = _parse_yaml(f, path) or {}
    except FileNotFoundError:
        where = f" (the '{BASE_KEY}' of {_chain[-1]})" if _chain else ""
        raise ConfigKeyError(f"config file {path} does not exist{where}") from None
    if not isinstance(data, dict):
        raise ConfigKeyError(f"{path}: the top level must be a mapping")
    bases = data.pop(BASE_KEY, None)
    if bases is None:
        return data
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigKeyError(f"{path}: '{BASE_KEY}' must be a file name or a list of file names, got {bases!r}")
    merged: dict = {}
    for name in bases:
        merged = merge(merged, read_config_file(os.path.join(os.path.dirname(path), name), _chain + (real,)))
    return merge(merged, data)


def load_config(path: str, overrides: Sequence[str] = ()) -> TrainConfig:
    """The ``TrainConfig`` of a config file (its ``base`` files resolved) with ``key=value`` overrides applied."""
    return config_from_dict(read_config_file(path), overrides)


def check_before_training(tcfg: TrainConfig) -> None:
    """Raises ``ConfigKeyError`` for the faults of ``tcfg`` that training would otherwise meet only after loading
    data or a model: a mesh the devices cannot hold, ``model.config`` fields of a random model, and trajectories
    of another block size than
    ``data.block_size`` (``TrajectoryFormatError`` when ``data.path`` holds no trajectories). Reads manifests
    only."""
    if tcfg.model.source == "random":
        try:
            ModelConfig.from_dict(tcfg.model.config)
        except (ConfigError, TypeError) as e:  # TypeError: unknown rope_scaling fields
            raise ConfigKeyError(f"model.config: {e}") from None
    import jax

    from jf_jax.model.sharding import mesh_problem

    problem = mesh_problem(tcfg.mesh.data, tcfg.mesh.fsdp, tcfg.mesh.tensor, jax.device_count())
    if problem:
        raise ConfigKeyError(f"mesh: {problem}")
    if tcfg.data.source == "trajectories":
        checked_trajectory_dirs(tcfg.data.paths, tcfg.data.block_size)


def checked_trajectory_dirs(paths: Sequence[str], block_size: int) -> list[str]:
    """The trajectory directories ``paths`` stand for (``trajectories.trajectory_dirs``), each checked to hold a
    manifest of blocks of ``block_size`` (``ConfigKeyError`` otherwise, ``TrajectoryFormatError`` for no
    trajectories): manifests only, so ``check_before_training`` can refuse bad data before any long work, and the
    data stream reads exactly the directories it checked."""
    dirs = [t for p in paths for t in trajectory_dirs(p)]
    for path in dirs:
        found = read_manifest(path)["block_size"]
        if found != block_size:
            raise ConfigKeyError(f"data.block_size={block_size} but {path} holds blocks of {found}")
    return dirs
