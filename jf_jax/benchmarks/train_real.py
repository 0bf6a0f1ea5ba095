"""A training config's real batches timed side by side at several recipes (batch size, AR teacher): seconds per
example, packed tokens/s, and the step time of each length bucket.

The synthetic benchmark (``train_step``: every example 320 tokens) found batch 4 1.66x faster per example
than batch 1, but the ``n16_b4`` run was not (issue 11). This times what a run does, on its own trajectories:

    python experiments/bench_train_real.py configs/smollm2_jf_n16_b4.yaml --examples 48 \\
        --variant 'b1_ce: data.batch_size=1 loss.ar_teacher=data' --variant 'b4_ce: loss.ar_teacher=data' \\
        --variant 'b4_kl:' --json results/studies/train_step_speed/train_step_real.json

Every variant trains from the config's initial weights on the same packed responses (drawn with a fixed seed from
its trajectories, as many per length bucket as fill whole batches at every variant's batch size, so no variant
pays for empty rows), batched by the run's own ``BatchStream`` (one epoch over them); variants may change the
batch size and the loss, not the data or its packing. Each bucket's shape is compiled by an untimed warm-up step
first; the timed steps then run in the stream's shuffled order, each timed from the host batch to the step's
metrics on the host, as the training loop does. Checkpoints and metrics files are not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

from jf_jax import host_memory  # imports no JAX
from jf_jax.benchmarks.ablation import parse_variant  # imports no JAX
from jf_jax.benchmarks.records import write_json


def choose_examples(lengths: list[int], buckets: list[int], *, examples: int, multiple: int, seed: int) -> list[int]:
    """Indices of about ``examples`` sequences, drawn in a seeded order, kept per bucket in whole ``multiple``s."""
    import numpy as np

    from jf_jax.training.packing import bucket_for

    by_bucket: dict[int, list[int]] = {}
    for i in np.random.default_rng(seed).permutation(len(lengths)):
        by_bucket.setdefault(bucket_for(lengths[i], buckets), []).append(int(i))
        kept = sum(len(v) // multiple * multiple for v in by_bucket.values())
        if kept >= examples:
            break
    chosen = [i for v in by_bucket.values() for i in v[:len(v) // multiple * multiple]]
    if not chosen:
        raise ValueError(f"the trajectories hold too few sequences for one batch of {multiple} in any bucket")
    return chosen


def time_recipe(tcfg, sequences: list, *, seed: int) -> dict:
    """Warm-up step per bucket, then every batch of ``sequences`` once, in the run's ``BatchStream`` order (one
    epoch: grouped by bucket, batches shuffled); per-step timings."""
    import jax

    from jf_jax.model.params import abstract_params
    from jf_jax.model.sharding import ShardingRules, make_mesh
    from jf_jax.training.setup import initial_params, model_config, teacher_params
    from jf_jax.training.packing import BatchStream
    from jf_jax.training.state import init_state, make_optimizer, state_shardings
    from jf_jax.training.step import make_train_step, put_batch

    d = tcfg.data
    cfg = model_config(tcfg)
    stream = BatchStream(sequences, batch_size=d.batch_size, buckets=d.buckets, pad_id=d.pad_id, seed=seed,
                         teacher_tokens=tcfg.loss.teacher_tokens)
    plan = stream.plan(0)
    first_of_bucket: dict[int, int] = {}
    for k, (row_len, _) in enumerate(plan):
        first_of_bucket.setdefault(row_len, k)
    mesh, rules = make_mesh(tcfg.mesh.data, tcfg.mesh.fsdp), ShardingRules()
    total_steps = len(plan) + len(first_of_bucket)
    optimizer = make_optimizer(cfg, tcfg.optim, total_steps)
    shardings = state_shardings(cfg, optimizer, abstract_params(cfg), mesh, rules)
    params = initial_params(tcfg, cfg)
    reference = None
    if tcfg.loss.ar_teacher == "reference":
        reference = jax.device_put(teacher_params(tcfg, cfg, params), shardings.params)
    step_fn = make_train_step(cfg, tcfg.loss, tcfg.optim, total_steps, mesh, rules, shardings, reference)
    state = jax.jit(lambda p: init_state(p, optimizer), out_shardings=shardings)(
        jax.device_put(params, shardings.params))
    del params

    def run(k):
        start = time.perf_counter()
        batch = stream.batch(k)
        new_state, metrics = step_fn(state, put_batch(batch, mesh, rules))
        loss = float(metrics["loss/total"])
        return new_state, time.perf_counter() - start, loss, int((batch["segment"] >= 0).sum())

    warmup = {}
    for row_len, k in sorted(first_of_bucket.items()):
        state, warmup[row_len], _, _ = run(k)
    steps = []
    for k, (row_len, rows) in enumerate(plan):
        state, seconds, loss, tokens = run(k)
        if not math.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss} in a timed step (bucket {row_len})")
        steps.append(dict(row_len=row_len, rows=len(rows), tokens=tokens, seconds=seconds))
    seconds = sum(s["seconds"] for s in steps)
    teacher = tcfg.loss.ar_teacher
    if teacher == "reference":  # which tokens its forward covers (loss.teacher_tokens)
        teacher += f" ({tcfg.loss.teacher_tokens} tokens)"
    return dict(batch_size=d.batch_size, ar_teacher=teacher, examples=len(sequences), steps=steps,
                warmup_seconds=warmup, timed_seconds=seconds, seconds_per_example=seconds / len(sequences),
                tokens_per_second=sum(s["tokens"] for s in steps) / seconds,
                padded_tokens_per_second=sum(s["row_len"] * s["rows"] for s in steps) / seconds,
                bucket_seconds_per_example={
                    row_len: statistics.median(s["seconds"] / s["rows"] for s in steps if s["row_len"] == row_len)
                    for row_len in sorted(first_of_bucket)})


def markdown(report: dict) -> str:
    rows = report["variants"]
    first = next(iter(rows.values()))["seconds_per_example"]
    buckets = sorted({b for r in rows.values() for b in r["bucket_seconds_per_example"]})
    lines = ["# Train step on a config's real batches, recipes side by side", "", f"`{report['command']}`", "",
             f"{next(iter(rows.values()))['examples']} packed responses per variant; buckets (examples): "
             + ", ".join(f"{b} ({n})" for b, n in report["bucket_counts"].items()), "",
             "Seconds per example: timed steps only (after an untimed warm-up step per bucket shape), host batch to "
             "metrics on the host. x the first: examples per second against the first variant.", "",
             "| variant | batch | AR teacher | s / example | x the first | packed tok/s | padded tok/s | "
             + " | ".join(f"s / ex. @{b}" for b in buckets) + " | warm-up (compile) s |",
             "|---|---|---|---|---|---|---|" + "---|" * len(buckets) + "---|"]
    for name, r in rows.items():
        per_bucket = " | ".join(f"{r['bucket_seconds_per_example'][b]:.2f}" if b in r["bucket_seconds_per_example"]
                                else "" for b in buckets)
        lines.append(f"| {name} | {r['batch_size']} | {r['ar_teacher']} | {r['seconds_per_example']:.2f} | "
                     f"{first / r['seconds_per_example']:.2f}x | {r['tokens_per_second']:.0f} | "
                     f"{r['padded_tokens_per_second']:.0f} | {per_bucket} | {sum(r['warmup_seconds'].values()):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None, program: str = "python -m jf_jax.benchmarks.train_real") -> int:
    """The command line above; ``program`` is how the report's ``command`` names what ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a training config whose trajectories exist (configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every variant")
    parser.add_argument("--variant", action="append", required=True,
                        help="'NAME: key=value ...' (the config's own recipe: 'NAME:'); repeat to compare")
    parser.add_argument("--examples", type=int, default=48, help="packed responses timed per variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also writes the markdown table beside it (.md)")
    args = parser.parse_intermixed_args(argv)
    if args.examples < 1:
        parser.error(f"--examples must be >= 1, got {args.examples}")

    from jf_jax.training.config import ConfigKeyError, load_config

    try:
        variants = dict(parse_variant(v) for v in args.variant)
        configs = {name: load_config(args.config, args.overrides + extra) for name, extra in variants.items()}
    except (ValueError, OSError, ConfigKeyError) as e:
        parser.error(str(e))
    if len(variants) != len(args.variant):
        parser.error("--variant names must differ")
    from jf_jax.training.setup import build_stream, model_config
    from jf_jax.training.packing import bucket_for

    first = next(iter(configs.values()))

    def packing(c):  # what decides the packed sequences and their buckets: everything but the batch size
        return dataclasses.replace(c.data, batch_size=1), c.loss.train_prompt

    differing = [name for name, c in configs.items() if packing(c) != packing(first)]
    if differing:
        parser.error(f"variant(s) {differing} change the data or its packing (data.* other than batch_size, "
                     "loss.train_prompt): every variant must time the same examples")
    stream = build_stream(first, "", model_config(first).vocab_size, progress=False)
    multiple = math.lcm(*(c.data.batch_size for c in configs.values()))
    try:
        chosen = choose_examples([len(s) for s in stream.sequences], first.data.buckets, examples=args.examples,
                                 multiple=multiple, seed=args.seed)
    except ValueError as e:  # too few sequences for whole batches
        parser.error(str(e))
    sequences = [stream.sequences[i] for i in chosen]
    del stream
    counts: dict[int, int] = {}
    for seq in sequences:
        b = bucket_for(len(seq), first.data.buckets)
        counts[b] = counts.get(b, 0) + 1
    report = dict(command=f"{program} " + shlex.join(argv if argv is not None else sys.argv[1:]),
                  bucket_counts=dict(sorted(counts.items())), variants={})
    for name, tcfg in configs.items():
        r = time_recipe(tcfg, sequences, seed=args.seed)
        report["variants"][name] = r
        print(f"{name}: batch {r['batch_size']}, teacher {r['ar_teacher']}: {r['seconds_per_example']:.2f} s/example, "
              f"{r['tokens_per_second']:.0f} packed tok/s; per bucket "
              + ", ".join(f"{b}: {s:.2f}" for b, s in r["bucket_seconds_per_example"].items()), flush=True)
    table = markdown(report)
    print(table)
    if args.json is not None:
        write_json(args.json, report)
        args.json.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # as train.py: time the allocator a run has
    sys.exit(main())
