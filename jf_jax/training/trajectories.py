"""Jacobi trajectories on disk: one record per (prompt, block), in resumable shards.

A collection run (``collect``) walks a list of prompts (token-id lists) in order, asks a ``record_fn`` (the
Jacobi recording driver) for the per-block trajectories of each, and writes them in shards.

Record (one per prompt ``example_id`` and block ``block_index`` = j, 0-based in the response)::

    prompt_ids   int32 [P_j]        the prompt followed by the fixed points of blocks 0 .. j-1
    states       int32 [K_j + 1, n] every iterate of block j: states[0] = the true random draft the block
                                    started from (docs/method.md, decision 2), states[k] = the n-token view
                                    ``accepted prefix ++ next draft`` after iteration k, states[-1] = the
                                    fixed point y*_j (the greedy block)

Directory layout::

    OUT_DIR/manifest.json          {"format": "jf-trajectories", "version": 1, "block_size": n,
                                    "num_prompts": N, "prompts_sha256": ..., "metadata": {...},
                                    "shards": [{"file", "prompt_start", "prompt_end", "num_records",
                                                "num_filtered", "num_mismatched"}, ...]}   (shards cover prompts
                                    [0, prompt_end of the last shard) contiguously)
    OUT_DIR/shard-00000.npz        example_id [R] int64, block_index [R] int32,
                                   prompt_offsets [R+1] int64 + prompt_tokens [sum P_j] int32,
                                   state_offsets [R+1] int64 + states [sum (K_j+1), n] int32
                                   (record r owns prompt_tokens[prompt_offsets[r]:prompt_offsets[r+1]] and
                                   states[state_offsets[r]:state_offsets[r+1]])

Shards and the manifest are written to a temporary name and renamed, so a killed run leaves only complete
shards; running ``collect`` again with the same prompts continues after the last complete shard (prompts
are fingerprinted, so a different prompt list is refused). Prompts rejected by the optional filter are
counted in ``num_filtered`` and produce no records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

FORMAT = "jf-trajectories"
VERSION = 1
MANIFEST = "manifest.json"


class TrajectoryFormatError(ValueError):
    """A trajectory directory is malformed or does not match the collection being resumed."""


@dataclasses.dataclass(frozen=True)
class Record:
    example_id: int
    block_index: int
    prompt_ids: np.ndarray
    """int32 [P_j]: prompt + fixed points of the earlier blocks."""
    states: np.ndarray
    """int32 [K + 1, n]: state 0 = random draft, ..., last = fixed point."""

    @property
    def fixed_point(self) -> np.ndarray:
        return self.states[-1]


def prompts_fingerprint(prompts: Sequence[Sequence[int]]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        arr = np.asarray(p, np.int64)
        h.update(np.int64(arr.size).tobytes())
        h.update(arr.tobytes())
    return h.hexdigest()


def _atomic_write_bytes(path: str, write: Callable) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(path: str, obj) -> None:
    _atomic_write_bytes(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))


def read_manifest(out_dir: str) -> dict:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        raise TrajectoryFormatError(f"{out_dir} holds no {MANIFEST}: not a trajectory directory")
    with open(path) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise TrajectoryFormatError(f"{path}: expected format {FORMAT} v{VERSION}, got "
                                    f"{manifest.get('format')} v{manifest.get('version')}")
    return manifest


def process_dir(out_dir: str, index: int, count: int) -> str:
    """Where process ``index`` of ``count`` writes its share of a multi-process collection."""
    return os.path.join(out_dir, f"process-{index:03d}-of-{count:03d}")


def trajectory_dirs(path: str) -> list[str]:
    """The trajectory directories ``path`` stands for: itself, or, for a multi-process collection, every
    ``process_dir`` under it (all of one process count, all present)."""
    if os.path.exists(os.path.join(path, MANIFEST)) or not os.path.isdir(path):
        return [path]
    parts = sorted(d for d in os.listdir(path) if d.startswith("process-"))
    counts = {d.rsplit("-of-", 1)[-1] for d in parts}
    if not parts or len(counts) != 1 or len(parts) != int(counts.pop()):
        raise TrajectoryFormatError(f"{path} is neither a trajectory directory (no {MANIFEST}) nor a complete "
                                    f"multi-process collection (found {parts or 'no process-* directories'})")
    return [os.path.join(path, d) for d in parts]


def write_shard(path: str, records: Sequence[Record], block_size: int) -> None:
    """Writes ``records`` to one ``.npz`` shard atomically."""
    for r in records:
        if r.states.ndim != 2 or r.states.shape[1] != block_size or r.states.shape[0] < 1:
            raise TrajectoryFormatError(f"record (example {r.example_id}, block {r.block_index}) has states of "
                                        f"shape {r.states.shape}, expected [num_states >= 1, {block_size}]")
    prompt_lens = [len(r.prompt_ids) for r in records]
    state_lens = [r.states.shape[0] for r in records]
    arrays = dict(
        example_id=np.asarray([r.example_id for r in records], np.int64),
        block_index=np.asarray([r.block_index for r in records], np.int32),
        prompt_offsets=np.concatenate([[0], np.cumsum(prompt_lens)]).astype(np.int64),
        prompt_tokens=(np.concatenate([r.prompt_ids for r in records]) if records else np.zeros(0)).astype(np.int32),
        state_offsets=np.concatenate([[0], np.cumsum(state_lens)]).astype(np.int64),
        states=(np.concatenate([r.states for r in records]) if records
                else np.zeros((0, block_size))).astype(np.int32),
    )
    _atomic_write_bytes(path, lambda f: np.savez_compressed(f, **arrays))


def read_shard(path: str) -> list[Record]:
    with np.load(path) as z:
        ex, blk = z["example_id"], z["block_index"]
        po, pt, so, st = z["prompt_offsets"], z["prompt_tokens"], z["state_offsets"], z["states"]
    return [Record(int(ex[r]), int(blk[r]), pt[po[r]:po[r + 1]], st[so[r]:so[r + 1]]) for r in range(len(ex))]


def iter_records(out_dir: str) -> Iterator[Record]:
    """All records of a trajectory directory, shard by shard, in collection order."""
    for shard in read_manifest(out_dir)["shards"]:
        yield from read_shard(os.path.join(out_dir, shard["file"]))


def load_responses(out_dir: str) -> list[list[Record]]:
    """Records grouped per prompt, blocks in order, with the layout checked.

    Checks that each prompt's blocks are 0..T-1 and that block j's prompt is block 0's prompt followed by
    the fixed points of blocks 0..j-1.
    """
    grouped: dict[int, list[Record]] = {}
    for rec in iter_records(out_dir):
        grouped.setdefault(rec.example_id, []).append(rec)
    responses = []
    for eid in sorted(grouped):
        recs = sorted(grouped[eid], key=lambda r: r.block_index)
        if [r.block_index for r in recs] != list(range(len(recs))):
            raise TrajectoryFormatError(f"example {eid}: block indices {[r.block_index for r in recs]} are not 0..T-1")
        expected = recs[0].prompt_ids
        for r in recs:
            if not np.array_equal(r.prompt_ids, expected):
                raise TrajectoryFormatError(f"example {eid} block {r.block_index}: prompt_ids are not the first "
                                            "prompt followed by the earlier fixed points")
            expected = np.concatenate([expected, r.fixed_point])
        responses.append(recs)
    return responses


def repetition_filter(ngram: int = 4, max_repeat_fraction: float = 0.5, eos_id: int | None = None):
    """A filter rejecting degenerate, repetitive responses.

    The response (fixed points concatenated, cut after the first ``eos_id``) is degenerate when more than
    ``max_repeat_fraction`` of its ``ngram``-grams are repeats of an earlier one. Returns a callable
    ``keep(response_ids) -> bool``.
    """

    def keep(response_ids) -> bool:
        tokens = np.asarray(response_ids).tolist()
        if eos_id is not None and eos_id in tokens:
            tokens = tokens[: tokens.index(eos_id) + 1]
        grams = [tuple(tokens[i:i + ngram]) for i in range(len(tokens) - ngram + 1)]
        if not grams:
            return True
        return 1.0 - len(set(grams)) / len(grams) <= max_repeat_fraction

    return keep


def collect(prompts: Sequence[Sequence[int]], record_fn: Callable | None, out_dir: str, *, block_size: int,
            prompts_per_shard: int = 16, keep_fn: Callable | None = None, metadata: dict | None = None,
            progress: bool = True, record_shard: Callable | None = None) -> dict:
    """Collects trajectories for ``prompts`` into ``out_dir``, resuming a previous run there.

    record_fn(prompt_ids) -> sequence of per-block state arrays ``[K_j + 1, n]``, or of objects with such a
    ``.states`` attribute (e.g. ``jf_jax.decoding.recording.BlockTrajectory``); block 0 first; in each, state 0 is
    the random draft and the last state the fixed point. For the Jacobi recorder::

        record_fn = lambda p: recording.record_trajectories(params, cfg, p, block_size=n, max_new_tokens=m,
                                                            eos_ids=(eos,), seed=s)

    Or, instead, ``record_shard(example_ids, prompts)`` -> one such sequence per prompt: a whole shard at once
    (the batched recorder, ``batch_recording.record_batch``, whose per-prompt ``ResponseTrajectories`` carry ``blocks``
    and ``mismatched``: responses cut short because a fixed point differed from the batched AR response are
    counted per shard in ``num_mismatched``).
    keep_fn(response_ids) -> bool (e.g. ``repetition_filter()``) drops a prompt whose response it rejects.
    Returns the final manifest.
    """
    if (record_fn is None) == (record_shard is None):
        raise ValueError("give exactly one of record_fn and record_shard")
    if record_shard is None:
        record_shard = lambda example_ids, shard_prompts: [record_fn(p) for p in shard_prompts]  # noqa: E731
    os.makedirs(out_dir, exist_ok=True)
    fingerprint = prompts_fingerprint(prompts)
    manifest_path = os.path.join(out_dir, MANIFEST)
    if os.path.exists(manifest_path):
        manifest = read_manifest(out_dir)
        for key, value in (("block_size", block_size), ("num_prompts", len(prompts)),
                           ("prompts_sha256", fingerprint)):
            if manifest[key] != value:
                raise TrajectoryFormatError(f"{out_dir} was collected with {key}={manifest[key]!r}, this run has "
                                            f"{value!r}; use another directory")
    else:
        manifest = dict(format=FORMAT, version=VERSION, block_size=block_size, num_prompts=len(prompts),
                        prompts_sha256=fingerprint, metadata=metadata or {}, shards=[])
        _write_json(manifest_path, manifest)
    start = manifest["shards"][-1]["prompt_end"] if manifest["shards"] else 0

    bar = tqdm(total=len(prompts), initial=start, desc="collect", unit="response", disable=not progress)
    for shard_start in range(start, len(prompts), prompts_per_shard):
        shard_end = min(shard_start + prompts_per_shard, len(prompts))
        records, filtered, mismatched = [], 0, 0
        shard_prompts = [np.asarray(prompts[eid], np.int32) for eid in range(shard_start, shard_end)]
        recorded = record_shard(list(range(shard_start, shard_end)), shard_prompts)
        for eid, prompt, response in zip(range(shard_start, shard_end), shard_prompts, recorded, strict=True):
            mismatched += bool(getattr(response, "mismatched", False))
            blocks = [np.asarray(getattr(b, "states", b), np.int32) for b in getattr(response, "blocks", response)]
            response = np.concatenate([b[-1] for b in blocks]) if blocks else np.zeros(0, np.int32)
            if not blocks or (keep_fn is not None and not keep_fn(response)):
                filtered += 1
            else:
                context = prompt
                for j, states in enumerate(blocks):
                    records.append(Record(eid, j, context, states))
                    context = np.concatenate([context, states[-1]])
            bar.update(1)
        name = f"shard-{len(manifest['shards']):05d}.npz"
        write_shard(os.path.join(out_dir, name), records, block_size)
        manifest["shards"].append(dict(file=name, prompt_start=shard_start, prompt_end=shard_end,
                                       num_records=len(records), num_filtered=filtered,
                                       num_mismatched=mismatched))
        _write_json(manifest_path, manifest)
        bar.set_postfix(records=sum(s["num_records"] for s in manifest["shards"]),
                        filtered=sum(s["num_filtered"] for s in manifest["shards"]))
    bar.close()
    return manifest
