"""What ``jf-jax collect`` checks before it loads a model: its numeric options, the prompt rows, and, when it
resumes into an existing ``--out``, that this run's setup is the one the directory was started with.

A collection directory must hold one setup's trajectories: training reads every shard of it as one data set, so
shards recorded with another model, seed, block size, ... appended under the first run's manifest would mix two
setups silently. The first run records ``CollectSettings`` in the manifest's metadata (``metadata.settings``);
every resume compares its own settings with them and is refused, naming each difference, before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os

from jf_jax.data.prompt_files import prompt_rows
from jf_jax.decoding.common import MAX_BATCH_SIZE, MAX_SEED


class CollectInputError(ValueError):
    """Bad input to ``jf-jax collect``, or a resume with another setup: refused before any work."""


def number_problems(args: argparse.Namespace) -> list[str]:
    """Why the numeric options cannot be used ([] when they can): a negative ``--offset`` or ``--limit`` would select
    other prompts through Python's slicing, and a bad seed or size would fail only after the model loaded."""
    problems = [f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
                for name in ("block_size", "max_new_tokens", "prompts_per_shard", "batch_size")
                if getattr(args, name) < 1]
    if args.batch_size > MAX_BATCH_SIZE:
        problems.append(f"--batch-size must be at most {MAX_BATCH_SIZE}, got {args.batch_size}")
    if args.limit is not None and args.limit < 1:
        problems.append(f"--limit must be at least 1, got {args.limit}")
    if args.offset < 0:
        problems.append(f"--offset must be at least 0, got {args.offset}")
    if not 0 <= args.seed <= MAX_SEED:  # the draft keys' range (decoding.common.prompt_key)
        problems.append(f"--seed must be in [0, {MAX_SEED}], got {args.seed}")
    if args.num_processes is not None and args.num_processes < 1:
        problems.append(f"--num-processes must be at least 1, got {args.num_processes}")
    if args.process_id is not None and args.process_id < 0:
        problems.append(f"--process-id must be at least 0, got {args.process_id}")
    elif None not in (args.process_id, args.num_processes) and args.process_id >= args.num_processes:
        problems.append(f"--process-id must be below --num-processes ({args.num_processes}), got {args.process_id}")
    return problems


def parse_prompt_rows(path: str, data: bytes) -> list[dict]:
    """The rows of a prompts JSONL file's bytes, each an object with a non-empty string "prompt"; a
    CollectInputError names the file and line (1-based, blank lines counted) of the first bad row."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CollectInputError(f"--prompts {path} is not UTF-8 text (byte {e.start})") from None
    try:
        rows = prompt_rows(text, path)
    except ValueError as e:
        raise CollectInputError(str(e)) from None
    if not rows:
        raise CollectInputError(f"--prompts {path} holds no prompts")
    return rows


def read_prompt_rows(path: str) -> tuple[list[dict], str]:
    """The checked rows of the prompts file ``path`` and the SHA-256 of its bytes (read once, so the two agree)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CollectInputError(f"cannot read --prompts {path}: {e.strerror or e}") from None
    return parse_prompt_rows(path, data), hashlib.sha256(data).hexdigest()


def domain_list(domains: str | None) -> tuple[str, ...] | None:
    """``--domains`` as ``select_prompts`` reads it, sorted: "math, code" and "code,math" select the same rows."""
    wanted = sorted({d.strip() for d in (domains or "").split(",") if d.strip()})
    return tuple(wanted) or None


def model_identity(spec: str) -> str:
    """A weights spec as recorded: a path made absolute (resuming from another directory names the same model),
    a registry name as given."""
    return os.path.abspath(spec) if os.path.exists(spec) else spec


@dataclasses.dataclass(frozen=True)
class RepetitionFilter:
    """The parameters of ``training.trajectories.repetition_filter`` as collect builds it (its defaults)."""

    ngram: int
    max_repeat_fraction: float

    @classmethod
    def current(cls) -> RepetitionFilter:
        from jf_jax.training.trajectories import repetition_filter

        params = inspect.signature(repetition_filter).parameters
        return cls(params["ngram"].default, params["max_repeat_fraction"].default)


def _setting(label: str, compared: bool = True):
    return dataclasses.field(metadata=dict(label=label, compared=compared))


@dataclasses.dataclass(frozen=True)
class CollectSettings:
    """Every setting of a collection run that shapes the trajectories it records, or which prompts it records.

    Left out, because they do not change a record: ``--prompts-per-shard`` (shards are contiguous prompt ranges, so
    a resume with another size continues the same sequence), ``--no-progress``, and the ``--distributed`` options
    (each process writes its own ``process-I-of-N`` directory, whose name carries its share)."""

    model: str = _setting("--model")
    dtype: str = _setting("--dtype")
    block_size: int = _setting("--block-size")
    max_new_tokens: int = _setting("--max-new-tokens")
    seed: int = _setting("--seed")
    chat: bool = _setting("chat template (--no-chat)")
    repetition_filter: RepetitionFilter | None = _setting("--repetition-filter")
    batch_size: int = _setting("--batch-size")
    decode_shape: str | None = _setting("decode shape (--decode-shape, resolved)")
    # The decode path's numerics (and "auto"'s shape) differ between backends: a CPU collection resumed on a GPU
    # would hold fixed points of two arithmetics.
    backend: str = _setting("JAX backend")
    # A tensor split reorders some sums, so a near-tie may resolve otherwise than on one device: one mesh per
    # collection (None: one device, or the local devices splitting rows only, which changes no token).
    mesh: str | None = _setting("--mesh")
    # The prompts are compared by content: the same file moved or named by another relative path selects the same
    # rows, while an edited file at the same path does not. The path is recorded for the reader only.
    prompts_file: str = _setting("--prompts", compared=False)
    prompts_sha256: str = _setting("--prompts (file contents, sha256)")
    domains: tuple[str, ...] | None = _setting("--domains")
    offset: int = _setting("--offset")
    limit: int | None = _setting("--limit")

    def to_json(self) -> dict:
        """The settings as the manifest records them (tuples as lists, as JSON reads them back)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def settings_from_args(args: argparse.Namespace, *, prompts_sha256: str, decode_shape: str | None,
                       backend: str, mesh: str | None = None) -> CollectSettings:
    """This run's settings: ``decode_shape`` is the resolved shape's label (None: natural shapes), so "auto" and the
    shape it stands for on ``backend`` are one setting."""
    return CollectSettings(
        model=model_identity(args.model), dtype=args.dtype, block_size=args.block_size,
        max_new_tokens=args.max_new_tokens, seed=args.seed, chat=not args.no_chat,
        repetition_filter=RepetitionFilter.current() if args.repetition_filter else None,
        batch_size=args.batch_size, decode_shape=decode_shape, backend=backend, mesh=mesh,
        prompts_file=os.path.abspath(args.prompts), prompts_sha256=prompts_sha256,
        domains=domain_list(args.domains), offset=args.offset, limit=args.limit)


_NOT_RECORDED = object()


def settings_differences(recorded: dict, current: CollectSettings) -> list[str]:
    """Each compared setting whose value differs, as "LABEL OLD (this run: NEW)". A setting the record lacks (a
    manifest from before it was recorded) counts as differing: what that run used cannot be known."""
    now = current.to_json()
    differences = []
    for field in dataclasses.fields(current):
        if not field.metadata["compared"]:
            continue
        old = recorded.get(field.name, _NOT_RECORDED)
        if old != now[field.name]:
            shown = "(not recorded)" if old is _NOT_RECORDED else json.dumps(old)
            differences.append(f"{field.metadata['label']} {shown} (this run: {json.dumps(now[field.name])})")
    return differences


def recorded_settings(out_dir: str) -> dict | None:
    """The settings recorded in ``out_dir``'s manifest; None when the directory holds no manifest (a new
    collection). A manifest without settings is refused: it was written before they were recorded and was never
    compared on resume, so it may already hold shards of several setups, and its own setup is only partly known.
    Accepting it would carry that risk forward; a new ``--out`` costs a re-collection, not a mixed data set."""
    from jf_jax.training.trajectories import MANIFEST, read_manifest

    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        manifest = read_manifest(out_dir)
        settings = manifest.get("metadata", {}).get("settings")
    except (ValueError, OSError, AttributeError) as e:  # unreadable, not JSON, or not a manifest object
        raise CollectInputError(f"cannot resume from {path}: {e}") from None
    if not isinstance(settings, dict):
        raise CollectInputError(f"cannot resume into --out {out_dir}: its manifest records no collection settings "
                                "(written before collect recorded them), so this run cannot be checked against the "
                                "setup of its shards; collect into a new --out")
    return settings


def check_resume(out_dir: str, current: CollectSettings) -> None:
    """Refuses (CollectInputError, one line naming each differing setting with its old and new value) a run into
    an existing collection directory whose recorded settings differ from ``current``; passes a new directory."""
    recorded = recorded_settings(out_dir)
    if recorded is None:
        return
    differences = settings_differences(recorded, current)
    if differences:
        raise CollectInputError(f"--out {out_dir} was collected with other settings: {'; '.join(differences)}; "
                                "resume with the recorded settings or collect into a new --out")


def legacy_collection_complete(out_dir: str, rows: list[dict]) -> bool:
    """Whether ``out_dir`` holds a manifest written before collect recorded its settings, whose shards already
    cover every prompt, and whose prompt ids are this run's selection: a re-run of a finished older collection
    (e.g. a study's stage that finds its parts complete) has nothing to add, so nothing can be mixed into it."""
    from jf_jax.training.trajectories import MANIFEST, read_manifest

    if not os.path.exists(os.path.join(out_dir, MANIFEST)):
        return False
    try:
        manifest = read_manifest(out_dir)
    except (ValueError, OSError):
        return False
    metadata = manifest.get("metadata") or {}
    shards = manifest.get("shards") or []
    covered = bool(shards) and shards[-1].get("prompt_end") == manifest.get("num_prompts") == len(rows)
    return ("settings" not in metadata and covered
            and metadata.get("prompt_ids") == [r.get("id") for r in rows])

