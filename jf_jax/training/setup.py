"""Setting up a training run: the config read once into a ``PreparedRun`` that ``loop.run_training`` runs.

* The model source (``model.source``) is read in one place, ``model_source``: a random init, a pretrained spec or
  a run dir, each answering for its architecture, its lineage (the base model whose tokenizer it keeps) and its
  initial weights, which are loaded only when asked (a resumed run needs none, unless it distils from them).
* A run dir holds one config: a resume with a config that computes something else is refused before anything is
  written; the snapshot (``config.yaml``) is written after the data is accepted.
* Sequences longer than the largest length bucket are left out; their number is printed when training starts
  (``TrainResult.num_dropped``), and a run where they would be more than ``data.max_dropped_share`` of the data
  stops with ``DroppedSequencesError`` before anything is trained.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence, TypeVar

import jax
import numpy as np
import optax
import yaml
from jax.sharding import Mesh

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, abstract_params, init_params
from jf_jax.model.sharding import ShardingRules, make_mesh, tensor_split_problem
from jf_jax.multihost import agree
from jf_jax.training.config import (ConfigKeyError, LoopSection, TrainConfig, checked_trajectory_dirs,
                                    config_from_dict)
from jf_jax.training.losses import LossConfig
from jf_jax.training.packing import BatchStream, bucket_for, example_from_records, pack_example
from jf_jax.training.state import OptimConfig, TrainState, make_optimizer, state_shardings
from jf_jax.training.step import reference_params
from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
from jf_jax.training.trajectories import collect, load_responses
from jf_jax.weights import run_dir as rd

T = TypeVar("T")


class DroppedSequencesError(ValueError):
    """More of the training sequences than ``data.max_dropped_share`` are longer than the largest length bucket."""


@functools.lru_cache(maxsize=1)
def _pretrained(spec: str):
    """The loaded spec, kept from reading its config until its weights are taken (one load for both)."""
    from jf_jax import weights

    return weights.load(spec, dtype="float32")


@dataclasses.dataclass(frozen=True)
class RandomInit:
    """``model.source: random``: the architecture ``model.config``, initialised from the run's seed."""

    architecture: dict
    seed: int

    def config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.architecture)

    def base_model(self) -> str | None:
        return None  # no tokenizer to inherit

    def params(self, cfg: ModelConfig) -> Params:
        """Jitted init of ``cfg`` (the trained config: its parameter dtype)."""
        return jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(self.seed))


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """``model.source: pretrained``: the weights of a ``jf_jax.weights.load`` spec (a name, a .gguf, a HF dir)."""

    spec: str

    def config(self) -> ModelConfig:
        return _pretrained(self.spec).cfg

    def base_model(self) -> str | None:
        return os.path.abspath(self.spec) if os.path.exists(self.spec) else self.spec

    def params(self, cfg: ModelConfig) -> Params:
        params = _pretrained(self.spec).params
        _pretrained.cache_clear()  # the caller copies them onto the mesh; do not keep a second copy alive
        return params


@dataclasses.dataclass(frozen=True)
class FromRun:
    """``model.source: run``: the exported params of a run dir, whose lineage the new run continues."""

    run_dir: str

    def config(self) -> ModelConfig:
        return rd.load_model_config(self.run_dir)

    def base_model(self) -> str | None:
        return rd.load_base_model(self.run_dir)

    def params(self, cfg: ModelConfig) -> Params:
        return rd.load_run(self.run_dir)[1]


ModelSource = RandomInit | Pretrained | FromRun


def model_source(tcfg: TrainConfig) -> ModelSource:
    """Where the run's model comes from: the one reading of ``model.source``."""
    if tcfg.model.source == "random":
        return RandomInit(tcfg.model.config, tcfg.seed)
    if tcfg.model.source == "pretrained":
        return Pretrained(tcfg.model.path)
    return FromRun(tcfg.model.path)


def model_config(tcfg: TrainConfig) -> ModelConfig:
    """The model's config with the training overrides of ``model.compute_dtype`` (master weights stay float32),
    ``model.remat``, ``model.attention_impl`` and ``model.attention_backward``."""
    cfg = model_source(tcfg).config()
    if tcfg.model.compute_dtype is not None:
        cfg = cfg.replace(dtype=tcfg.model.compute_dtype, param_dtype="float32")
    for name in ("remat", "attention_impl", "attention_backward"):
        if getattr(tcfg.model, name) is not None:
            cfg = cfg.replace(**{name: getattr(tcfg.model, name)})
    return cfg


def base_model_spec(tcfg: TrainConfig) -> str | None:
    """The pretrained spec the run descends from (its tokenizer), or None for random init."""
    return model_source(tcfg).base_model()


def initial_params(tcfg: TrainConfig, cfg: ModelConfig) -> Params:
    """The run's initial weights: random (seeded by ``tcfg.seed``), pretrained, or another run's."""
    return model_source(tcfg).params(cfg)


def teacher_params(tcfg: TrainConfig, cfg: ModelConfig, initial: Params) -> Params:
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


def _primary() -> bool:
    """Whether this process writes the run's files (process 0 of a ``jax.distributed`` run; the only one
    otherwise). Orbax checkpoints are written by every process together."""
    return jax.process_index() == 0


def _all_processes(step: str, work: Callable[[], T]) -> T:
    """``work()`` on every process, then a barrier (``multihost.agree``) that carries failures: an error on one
    process is raised on every process, its own where it happened, a ``RuntimeError`` naming it elsewhere, rather
    than leaving the others waiting."""
    error, result = None, None
    try:
        result = work()
    except Exception as e:  # noqa: BLE001 (posted to the others, then raised)
        error = e
    failed = agree(f"training/{step}", None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"{step}: {failed}")
    return result


def build_stream(tcfg: TrainConfig, run_dir: str, vocab_size: int, progress: bool = True) -> BatchStream:
    """Every process builds the same global batches (deterministic from the data and the seed); ``put_batch``
    then places each row on the devices of its data-parallel shard."""
    d = tcfg.data
    paths = d.paths
    if d.source == "synthetic":
        s = d.synthetic
        paths = (os.path.join(run_dir, rd.TRAJECTORY_DIR),)
        prompts = make_prompts(s.num_prompts, s.prompt_len, s.vocab_size, seed=d.seed)
        # process 0 writes them; the others read them once it has
        _all_processes("synthetic trajectories", lambda: _primary() and collect(
            prompts, SyntheticRecorder(d.block_size, s.num_blocks, s.vocab_size), paths[0],
            block_size=d.block_size, progress=progress, metadata={"source": "synthetic"}))
    responses = []
    for path in checked_trajectory_dirs(paths, d.block_size):
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


NOT_COMPARED = (("data", "max_dropped_share"),)
"""Config keys that do not change what a run computes: a run resumes with other values of them."""
NOT_COMPARED_SECTIONS = ("mesh",)
"""Config sections that do not change what a run computes: ``mesh`` places the state and the batches on devices,
and a checkpoint written on one mesh is resharded onto another by the restore."""


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


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A run as its loop sees it: the config's sections it reads, already resolved (the model, the data, the
    mesh, the optimizer and the frozen teacher)."""

    run_dir: str
    name: str
    """``run_name``: the label of the progress bar and the messages."""
    primary: bool
    """Whether this process writes the run's files (orbax checkpoints are written by every process)."""
    cfg: ModelConfig
    """The trained model's config, with the training overrides (``model_config``)."""
    model: ModelSource
    """Where a new run's initial weights come from."""
    train: LoopSection
    loss: LossConfig
    optim: OptimConfig
    mesh: Mesh
    rules: ShardingRules
    stream: BatchStream
    optimizer: optax.GradientTransformation
    shardings: TrainState
    """Where each part of the state lives on ``mesh``."""
    reference: Params | None
    """The frozen teacher of ``loss.ar_teacher=reference`` on the mesh (rebuilt from the config on resume, not
    checkpointed); None without it."""


def prepare_run(tcfg: TrainConfig, run_dir: str, *, progress: bool = True, devices=None,
                rules: ShardingRules = ShardingRules()) -> tuple[PreparedRun, Params | None]:
    """The run in ``run_dir`` set up from ``tcfg``, and the host copy of its initial weights when the teacher
    needed them (None otherwise: a new run loads them from ``PreparedRun.model``). The caller drops that copy once
    the state is on the mesh.

    In this order, so that each refusal comes before the work it would waste: the config against the run dir's
    snapshot, the mesh against the model, the data against the buckets; only then the config snapshot, and the
    initial weights where the teacher needs them."""
    os.makedirs(run_dir, exist_ok=True)
    # a changed config is refused by every process before any is written over
    write_config = _all_processes("config checked", lambda: _check_config(tcfg, run_dir))
    source = model_source(tcfg)
    cfg = model_config(tcfg)
    mesh = make_mesh(tcfg.mesh.data, tcfg.mesh.fsdp, devices, tensor=tcfg.mesh.tensor)
    split = tensor_split_problem(cfg, tcfg.mesh.tensor)
    if split:  # before the data and the weights load
        raise ConfigKeyError(f"mesh.tensor: {split}")
    primary = _primary()
    if primary:
        rd.save_model_config(run_dir, cfg)
        rd.save_base_model(run_dir, source.base_model())
    # Before the config snapshot: a new run refused for its data can be started again with other buckets.
    stream = build_stream(tcfg, run_dir, cfg.vocab_size, progress and primary)
    if primary:
        if write_config:
            _write_config(tcfg, run_dir)
        kept, dropped = len(stream.sequences), stream.num_dropped
        print(f"{tcfg.run_name}: {kept} training sequences; {dropped} ({dropped / (kept + dropped):.1%}) longer than "
              f"the largest length bucket ({max(tcfg.data.buckets)} tokens) left out (data.max_dropped_share="
              f"{tcfg.data.max_dropped_share:g})", flush=True)

    optimizer = make_optimizer(cfg, tcfg.optim, tcfg.train.steps)
    shardings = state_shardings(cfg, optimizer, abstract_params(cfg), mesh, rules)
    initial = reference = None
    if tcfg.loss.ar_teacher == "reference":  # the run's initial weights or loss.ar_reference
        initial = source.params(cfg)
        reference = jax.device_put(teacher_params(tcfg, cfg, initial), shardings.params)
    run = PreparedRun(run_dir=run_dir, name=tcfg.run_name, primary=primary, cfg=cfg, model=source, train=tcfg.train,
                      loss=tcfg.loss, optim=tcfg.optim, mesh=mesh, rules=rules, stream=stream, optimizer=optimizer,
                      shardings=shardings, reference=reference)
    return run, initial
