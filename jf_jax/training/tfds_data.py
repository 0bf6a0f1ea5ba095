"""Trajectories and prompt sets as tensorflow-datasets data sources over array_record: random access by index,
no TensorFlow import (TFDS builds and reads array_record files with numpy features).

::

    TRAJ_DIR/tfds/jacobi_trajectories/1.0.0/...   written by ``build_trajectories(TRAJ_DIR)`` (or
                                                  ``python -m jf_jax.collect --tfds``) from the npz shards
    source = trajectory_source(TRAJ_DIR)           # len(source), source[i] -> dict, in collection order
    records = [to_record(source[i]) for i in order.indices(epoch)]

The npz shards (``training.trajectories``) stay the resumable collection format and are still read directly;
the TFDS dataset is a view of a finished collection, one example per (prompt, block) record with the same fields.
Prompt sets (``python -m jf_jax.prompts`` JSONL) get the same treatment (``build_prompts`` / ``prompt_source``).

``ShardedOrder`` gives each of ``process_count`` data-parallel processes its own indices: one seeded permutation
per epoch, dealt round-robin and cut to equal counts, so every process reads disjoint records in an order that
depends only on (seed, epoch, process_index, process_count).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np

from jf_jax.training.trajectories import Record, iter_records, read_manifest

TFDS_DIR = "tfds"
TRAJECTORIES = "jacobi_trajectories"
PROMPTS = "jacobi_prompts"
_PROMPT_FIELDS = ("id", "domain", "prompt", "answer")


def _tfds():
    import tensorflow_datasets as tfds  # deferred: only these datasets need it (and it never imports TensorFlow)

    return tfds


@functools.cache  # TFDS registers a builder class by name when it is created: create each once
def _trajectory_builder_class():
    tfds = _tfds()

    class JacobiTrajectories(tfds.core.GeneratorBasedBuilder):
        """One example per (prompt, block) record of a ``training.trajectories`` directory, in collection order."""

        VERSION = tfds.core.Version("1.0.0")

        def __init__(self, *, source_dir: str, **kwargs):
            self._source_dir = source_dir
            self._manifest = read_manifest(source_dir)
            super().__init__(**kwargs)

        def _info(self):
            n = self._manifest["block_size"]
            features = tfds.features.FeaturesDict({
                "example_id": np.int64, "block_index": np.int32,
                "prompt_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
                "states": tfds.features.Tensor(shape=(None, n), dtype=np.int32),
            })
            return tfds.core.DatasetInfo(builder=self, features=features, disable_shuffling=True,
                                         description=json.dumps({k: v for k, v in self._manifest.items()
                                                                 if k != "shards"}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for r in iter_records(self._source_dir):
                yield f"{r.example_id}-{r.block_index}", dict(example_id=r.example_id, block_index=r.block_index,
                                                              prompt_ids=r.prompt_ids, states=r.states)

    return JacobiTrajectories


@functools.cache
def _prompt_builder_class():
    tfds = _tfds()

    class JacobiPrompts(tfds.core.GeneratorBasedBuilder):
        """The rows of a prompt-set JSONL (id, domain, prompt, answer; "" where a row has none), in file order."""

        VERSION = tfds.core.Version("1.0.0")

        def __init__(self, *, rows: list[dict] | None = None, **kwargs):
            self._rows = rows
            super().__init__(**kwargs)

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, disable_shuffling=True, features=tfds.features.FeaturesDict(
                {k: tfds.features.Text() for k in _PROMPT_FIELDS}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i, row in enumerate(self._rows or ()):
                yield i, {k: str(row.get(k) or "") for k in _PROMPT_FIELDS}

    return JacobiPrompts


def _prepare(builder) -> str:
    builder.download_and_prepare()  # nothing is downloaded: the examples come from _generate_examples
    return builder.data_dir


def build_trajectories(traj_dir: str) -> str:
    """Writes (once) the TFDS array_record dataset of a finished trajectory directory into ``TRAJ_DIR/tfds``."""
    manifest = read_manifest(traj_dir)
    done = manifest["shards"][-1]["prompt_end"] if manifest["shards"] else 0
    if done != manifest["num_prompts"]:
        raise ValueError(f"{traj_dir} holds {done} of {manifest['num_prompts']} prompts: finish the collection "
                         "(re-run its command) before building the TFDS dataset")
    cls = _trajectory_builder_class()
    return _prepare(cls(source_dir=traj_dir, data_dir=os.path.join(traj_dir, TFDS_DIR), file_format="array_record"))


def trajectory_source(traj_dir: str):
    """The random-access TFDS data source of ``build_trajectories(traj_dir)`` (train split)."""
    cls = _trajectory_builder_class()
    builder = cls(source_dir=traj_dir, data_dir=os.path.join(traj_dir, TFDS_DIR), file_format="array_record")
    if not os.path.isdir(builder.data_dir):
        raise FileNotFoundError(f"{traj_dir} has no TFDS dataset yet: run build_trajectories (or collect.py --tfds)")
    return builder.as_data_source()["train"]


def to_record(example: dict) -> Record:
    """A TFDS example of the trajectories dataset as the ``training.trajectories.Record`` the npz reader gives."""
    return Record(int(example["example_id"]), int(example["block_index"]),
                  np.asarray(example["prompt_ids"], np.int32), np.asarray(example["states"], np.int32))


def build_prompts(jsonl_path: str, data_dir: str) -> str:
    """Writes the TFDS dataset of a prompt-set JSONL under ``data_dir``."""
    from jf_jax.data.build import read_jsonl

    cls = _prompt_builder_class()
    return _prepare(cls(rows=read_jsonl(jsonl_path), data_dir=data_dir, file_format="array_record"))


def prompt_source(data_dir: str):
    """The random-access TFDS data source of ``build_prompts(..., data_dir)``: dicts of str fields."""
    cls = _prompt_builder_class()
    source = cls(data_dir=data_dir, file_format="array_record").as_data_source()["train"]
    return _DecodedPrompts(source)


@dataclasses.dataclass(frozen=True)
class _DecodedPrompts:
    source: object

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        row = self.source[index]
        return {k: v.decode("utf-8") if isinstance(v, bytes) else str(v) for k, v in row.items()}


@dataclasses.dataclass(frozen=True)
class ShardedOrder:
    """Deterministic shuffling and sharding of ``num_records`` records over data-parallel processes."""

    num_records: int
    seed: int
    process_index: int = 0
    process_count: int = 1

    def __post_init__(self):
        if self.process_count < 1 or not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index {self.process_index} is not in [0, process_count={self.process_count})")
        if self.num_records < self.process_count:
            raise ValueError(f"{self.num_records} records cannot feed {self.process_count} processes")

    @property
    def per_process(self) -> int:
        """Records each process reads per epoch (the remainder of an uneven split is left out of that epoch)."""
        return self.num_records // self.process_count

    def indices(self, epoch: int) -> np.ndarray:
        """This process's record indices for ``epoch``: a slice of one permutation all processes share."""
        order = np.random.default_rng([self.seed, epoch]).permutation(self.num_records)
        return order[self.process_index::self.process_count][: self.per_process]
