"""Collect Jacobi trajectories (training data) of a model on prompts from a JSONL file.

    python -m jf_jax.collect --model smollm2-135m --prompts runs/prompts/train.jsonl \\
        --out runs/trajectories/smollm2_n16 --block-size 16 --max-new-tokens 256 --limit 400 --repetition-filter

--model is any jf_jax.weights spec: "smollm2-135m", a .gguf, a HF directory, or a training RUN_DIR (round 2 of
progressive distillation re-collects with the round-1 model at a larger block size). Each prompt goes through
the model's chat template and jf_jax.decoding.recording.record_trajectories (every iterate of every block, state 0 = the
random draft); records are written by jf_jax.training.trajectories.collect in resumable shards (the on-disk format is
documented there). Re-running the same command continues after the last complete shard. The first run records
every setting that shapes a trajectory or selects the prompts in the manifest's metadata ("settings": the model,
dtype, block size, max new tokens, seed, chat template, repetition filter, batch size, decode shape, backend, the
prompts file's contents, --domains, --offset, --limit; jf_jax.cli.collect_settings); a resume with any of them
different is refused, naming each, before the model loads: use a new directory for another setup.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from jf_jax.cli.collect_settings import (CollectInputError, check_resume, legacy_collection_complete,
                                         number_problems, read_prompt_rows, settings_from_args)
from jf_jax.cli.distributed import add_distributed_args, init_distributed
from jf_jax.cli.mesh import build_mesh, mesh_error, parse_mesh, plain_layout
from jf_jax.cli.output_paths import directory_problem


def select_prompts(rows: list[dict], domains: str | None, limit: int | None, offset: int = 0) -> list[dict]:
    """Rows of the wanted domains (comma list; None = all) in file order: ``limit`` of them from ``offset`` on."""
    if offset < 0 or (limit is not None and limit < 0):  # Python's slicing would count them from the end
        raise ValueError(f"offset and limit must not be negative, got offset={offset}, limit={limit}")
    if domains:
        wanted = {d.strip() for d in domains.split(",") if d.strip()}
        rows = [r for r in rows if r.get("domain") in wanted]
    rows = rows[offset:]
    return rows[:limit] if limit is not None else rows


def process_share(out: str, rows: list[dict]) -> tuple[str, list[dict]]:
    """This process's share of a multi-process collection (``--distributed``): every ``process_count``-th prompt
    from its index on, into ``OUT/process-I-of-N`` (training on ``OUT`` reads every process's directory,
    ``training.trajectories.trajectory_dirs``); with one process, ``OUT`` and every prompt."""
    import jax

    from jf_jax.training.trajectories import process_dir

    count, index = jax.process_count(), jax.process_index()
    if count == 1:
        return out, rows
    return process_dir(out, index, count), rows[index::count]


def process_prompt_index():
    """The map from this process's example ids to indices in the whole selection (``process_share``: example i of
    process I of N is prompt I + i N), or None with one process."""
    import jax

    count, index = jax.process_count(), jax.process_index()
    return None if count == 1 else (lambda i: index + i * count)


class PromptTooLongError(ValueError):
    """A prompt plus the response collected for it does not fit the model's context."""


def check_lengths(rows: list[dict], prompts, *, max_new_tokens: int, context: int) -> None:
    """Refuses, before any decoding, a prompt whose tokens plus ``max_new_tokens`` (whole blocks) exceed the
    model's context: naming it, rather than failing when its shard comes up, hours in."""
    too_long = [(r.get("id", i), len(p)) for i, (r, p) in enumerate(zip(rows, prompts))
                if len(p) + max_new_tokens > context]
    if too_long:
        first_id, first_len = too_long[0]
        raise PromptTooLongError(
            f"{len(too_long)} prompt(s) do not fit the model's context of {context} tokens with {max_new_tokens} "
            f"new tokens (whole blocks), e.g. {first_id!r} ({first_len} tokens); lower --max-new-tokens or leave "
            f"them out (--domains / --offset / --limit); nothing is truncated silently")


class MeshError(ValueError):
    """A --mesh the model cannot be split over."""


def make_record_shard(params, cfg, *, block_size: int, max_new_tokens: int, eos_ids, seed: int, batch_size: int = 1,
                      decode_shape=None, mesh=None, prompt_index=None):
    """``record_shard(example_ids, prompts)`` for ``training.trajectories.collect``: prompt ``example_id`` draws its
    drafts from ``prompt_key(seed, example_id)``, so a response's trajectories do not depend on the shard or the
    batch. ``batch_size`` 1 records one prompt at a time through the Python driver (``record_trajectories``);
    larger sizes use the batched recorder (``record_batch``: the same trajectories, as rows of batched programs, its
    forwards padded to ``decode_shape`` when one is given). ``prompt_index`` maps a shard's example id to the
    prompt's index in the whole selection (a process's share of a multi-process collection), which keys its
    drafts, so the union of the processes' parts is the one-process collection."""
    from jf_jax.decoding.batch_recording import record_batch
    from jf_jax.decoding.recording import record_trajectories

    options = dict(block_size=block_size, max_new_tokens=max_new_tokens, eos_ids=eos_ids, seed=seed)

    def record_shard(example_ids, prompts):
        example_ids = [i if prompt_index is None else prompt_index(i) for i in example_ids]
        if batch_size == 1:
            return [record_trajectories(params, cfg, p, prompt_index=i, **options)
                    for i, p in zip(example_ids, prompts)]
        return record_batch(params, cfg, prompts, prompt_indices=example_ids, batch_size=batch_size,
                            decode_shape=decode_shape, mesh=mesh, **options)

    return record_shard


def run_collect(model, rows: list[dict], out: str, *, block_size: int, max_new_tokens: int, seed: int = 0,
                repetition_filter: bool = False, prompts_per_shard: int = 16, chat: bool = True,
                metadata: dict | None = None, progress: bool = True, batch_size: int = 1,
                decode_shape: str = "auto", mesh=None) -> dict:
    """Collects trajectories of ``model`` (a ``jf_jax.weights.LoadedModel``) on ``rows`` into ``out``; the batched
    recorder pads its forwards to ``decode_shape`` ("auto": on GPUs and TPUs, ``api.run_shape``) and spreads over
    ``mesh`` when one is given."""
    from jf_jax.api import encode_prompts, run_shape
    from jf_jax.decoding.shapes import shape_label
    from jf_jax.training.trajectories import collect, repetition_filter as make_filter

    prompts = encode_prompts(model, [r["prompt"] for r in rows], chat=chat)
    check_lengths(rows, prompts, max_new_tokens=-(-max_new_tokens // block_size) * block_size,
                  context=model.cfg.max_position_embeddings)
    shape = run_shape(decode_shape, [("ar", {}), ("jacobi", dict(block_size=block_size))]) if batch_size > 1 else None
    eos = tuple(model.tokenizer.eos_ids)
    keep = make_filter(eos_id=eos[0] if eos else None) if repetition_filter else None
    meta = dict(model=model.name, model_source=model.source, block_size=block_size, max_new_tokens=max_new_tokens,
                seed=seed, chat=chat, repetition_filter=repetition_filter, eos_ids=list(eos),
                prompt_ids=[r.get("id") for r in rows], decode_shape=shape_label(shape), **(metadata or {}))
    record_shard = make_record_shard(model.params, model.cfg, block_size=block_size, max_new_tokens=max_new_tokens,
                                     eos_ids=eos, seed=seed, batch_size=batch_size, decode_shape=shape, mesh=mesh,
                                     prompt_index=process_prompt_index())
    return collect(prompts, None, out, block_size=block_size, prompts_per_shard=prompts_per_shard, keep_fn=keep,
                   metadata=meta, progress=progress, record_shard=record_shard)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="jf-jax collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="weights spec or training RUN_DIR")
    p.add_argument("--prompts", required=True, help="JSONL with a 'prompt' field (python -m jf_jax.prompts)")
    p.add_argument("--out", required=True, help="trajectory directory (resumed if it exists)")
    p.add_argument("--domains", help="comma list of domains to keep (e.g. code,math); default all")
    p.add_argument("--limit", type=int, help="use the first N prompts (after the domain filter and --offset)")
    p.add_argument("--offset", type=int, default=0,
                   help="skip the first N prompts: two processes on disjoint ranges collect in parallel into two "
                        "directories (XLA:CPU runs a small decode forward on about one core); train on both "
                        "with data.path=[DIR1,DIR2]")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="seed of the random draft initialisation")
    p.add_argument("--repetition-filter", action="store_true", help="drop degenerate, repetitive responses")
    p.add_argument("--prompts-per-shard", type=int, default=16)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="decode dtype of the recording model: bfloat16 records the bf16 model's own trajectories "
                        "(its greedy fixed points) ~2.3x faster on an AVX512-BF16 CPU (results/studies/"
                        "decode_engine_speed/bench_engine.md); float32, the reference, by default")
    p.add_argument("--batch-size", type=int, default=1,
                   help="1 records one prompt at a time through the Python driver; B > 1 decodes the greedy responses "
                        "by batched AR, then iterates every block of every response as rows of batched Jacobi "
                        "programs of B rows (the same trajectories, tested equal)")
    p.add_argument("--decode-shape", default="auto",
                   help="with --batch-size > 1: pad the AR and Jacobi forwards to one shape, ROWSxWIDTH per prompt: "
                        "'auto' (1xN on GPUs and TPUs, so AR and the blocks run the same kernels: every fixed point "
                        "equalled AR's tokens on an H100, and no TPU has run it; off on CPUs, whose decode path is "
                        "bit-invariant by construction), 'off', or e.g. 1x32 (jf_jax.decoding.shapes)")
    p.add_argument("--mesh", type=parse_mesh,
                   help="with --batch-size > 1: spread the batched recorder over devices, data=D,fsdp=F,tensor=T "
                        "(rows over data x fsdp, heads, MLP units and vocabulary over tensor); unnamed axes are 1")
    p.add_argument("--no-progress", action="store_true")
    add_distributed_args(p)
    args = p.parse_args(argv)
    problems = number_problems(args)
    if args.mesh is not None and args.batch_size == 1:
        problems.append("--mesh spreads the batched recorder: give --batch-size > 1 with it")
    if not (args.distributed or args.coordinator):  # a multi-process run counts its devices once it has joined
        problems += [p for p in (mesh_error(args.mesh, [args.model]),) if p]  # devices and heads, before anything loads
    if problems:
        print(f"error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    from jf_jax.api import run_shape
    from jf_jax.decoding.common import GenerationError

    try:
        run_shape(args.decode_shape, [("ar", {}), ("jacobi", dict(block_size=args.block_size))], backend="cpu")
    except GenerationError as e:
        print(f"error: --decode-shape: {e}", file=sys.stderr)
        return 2
    if args.decode_shape not in ("auto", "off") and args.batch_size == 1:
        print("error: --decode-shape pads the batched collector's forwards: give --batch-size > 1 with it (the "
              "one-prompt recorder runs at natural shapes)", file=sys.stderr)
        return 2
    problem = directory_problem(args.out)
    if problem:
        print(f"error: cannot write --out {args.out}: {problem}", file=sys.stderr)
        return 2

    import jax

    from jf_jax.api import load_model
    from jf_jax.decoding.shapes import shape_label
    from jf_jax.training.trajectories import TrajectoryFormatError
    from jf_jax.weights.hf_names import WeightsError

    try:  # everything checkable without the model is checked before it loads: a refusal costs no load
        all_rows, file_sha = read_prompt_rows(args.prompts)
        rows = select_prompts(all_rows, args.domains, args.limit, args.offset)
        if not rows:
            raise CollectInputError(f"no prompts selected from {args.prompts}")
        init_distributed(args)
        if args.distributed or args.coordinator:
            problem = mesh_error(args.mesh, [args.model])  # this process's devices and the heads, before anything loads
            if problem:
                raise CollectInputError(problem)
        out, rows = process_share(args.out, rows)
        # The shape run_collect pads to, resolved on this backend ("auto" differs between CPUs and GPUs).
        shape = run_shape(args.decode_shape, [("ar", {}), ("jacobi", dict(block_size=args.block_size))]) \
            if args.batch_size > 1 else None
        settings = settings_from_args(args, prompts_sha256=file_sha, decode_shape=shape_label(shape),
                                      backend=jax.default_backend(), mesh=None if args.mesh is None else str(args.mesh))
        if legacy_collection_complete(out, rows):
            print(f"nothing to collect: {out} already holds all {len(rows)} selected prompts (its manifest predates "
                  "recorded settings, so they were not compared)")
            return 0
        check_resume(out, settings)
    except CollectInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        # On a mesh the weights keep the plain layout XLA can split (no CPU-kernel packing).
        model = load_model(args.model, dtype=args.dtype, **plain_layout(args.mesh))
        try:
            mesh = None if args.mesh is None else build_mesh(args.mesh, model.cfg)
        except ValueError as e:  # the model's heads do not divide the tensor axis
            raise MeshError(str(e)) from None
        manifest = run_collect(model, rows, out, block_size=args.block_size, mesh=mesh,
                               max_new_tokens=args.max_new_tokens, seed=args.seed,
                               repetition_filter=args.repetition_filter, prompts_per_shard=args.prompts_per_shard,
                               chat=not args.no_chat, batch_size=args.batch_size, decode_shape=args.decode_shape,
                               metadata=dict(prompts_file=args.prompts, prompts_file_sha256=file_sha,
                                             model_spec=args.model, dtype=args.dtype,
                                             batch_size=args.batch_size, settings=settings.to_json()),
                               progress=not args.no_progress)
    except (WeightsError, TrajectoryFormatError, FileNotFoundError, PromptTooLongError, MeshError) as e:  # one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    shards = manifest["shards"]
    print(json.dumps(dict(out=out, prompts=len(rows), records=sum(s["num_records"] for s in shards),
                          filtered=sum(s["num_filtered"] for s in shards),
                          mismatched=sum(s.get("num_mismatched", 0) for s in shards),
                          seconds=round(time.perf_counter() - start, 1))))
    return 0

