"""A training config's real batches timed side by side at several recipes (batch size, AR teacher): seconds per
example, packed tokens/s, and the step time of each length bucket.

The synthetic benchmark (``bench_train_step.py``: every example 320 tokens) found batch 4 1.66x faster per example
than batch 1, but the ``n16_b4`` run was not (issue 11). This times what a run does, on its own trajectories:

    python experiments/bench_train_real.py configs/smollm2_jf_n16_b4.yaml --examples 48 \\
        --variant 'b1_ce: data.batch_size=1 loss.ar_teacher=data' --variant 'b4_ce: loss.ar_teacher=data' \\
        --variant 'b4_kl:' --json experiments/results/train_step_real.json

Every variant trains from the config's initial weights on the same packed responses (drawn with a fixed seed from
its trajectories, as many per length bucket as fill whole batches at every variant's batch size, so no variant
pays for empty rows), grouped by bucket as the run's ``BatchStream`` groups them. Each bucket's shape is compiled
by an untimed warm-up step first; the timed steps then run in a shuffled order, each timed from the host batch to
the step's metrics on the host, as the training loop does. Checkpoints and metrics files are not timed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from jf_jax import host_memory  # imports no JAX

if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # as train.py: time the allocator a run has

from experiments.ablate import parse_variant  # noqa: E402


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


def time_recipe(tcfg, chosen: list[int], *, seed: int) -> dict:
    """Warm-up step per bucket, then every batch of ``chosen`` once in a shuffled order; per-step timings."""
    import jax
    import numpy as np

    from jf_jax.model.params import abstract_params
    from jf_jax.model.sharding import ShardingRules, make_mesh
    from jf_jax.training.loop import build_stream, initial_params, model_config
    from jf_jax.training.packing import bucket_for, make_batch
    from jf_jax.training.state import init_state, make_optimizer, state_shardings
    from jf_jax.training.step import make_train_step, put_batch, reference_params

    d = tcfg.data
    cfg = model_config(tcfg)
    stream = build_stream(tcfg, "", cfg.vocab_size, progress=False)
    seqs = [stream.sequences[i] for i in chosen]
    by_bucket: dict[int, list] = {}
    for s in seqs:
        by_bucket.setdefault(bucket_for(len(s), d.buckets), []).append(s)
    batches = [(row_len, group[k:k + d.batch_size]) for row_len, group in sorted(by_bucket.items())
               for k in range(0, len(group), d.batch_size)]
    mesh, rules = make_mesh(tcfg.mesh.data, tcfg.mesh.fsdp), ShardingRules()
    total_steps = len(batches) + len(by_bucket)
    optimizer = make_optimizer(cfg, tcfg.optim, total_steps)
    shardings = state_shardings(cfg, optimizer, abstract_params(cfg), mesh, rules)
    params = initial_params(tcfg, cfg)
    reference = None
    if tcfg.loss.ar_teacher == "reference":
        reference = jax.device_put(reference_params(params, cfg), shardings.params)
    step_fn = make_train_step(cfg, tcfg.loss, tcfg.optim, total_steps, mesh, rules, shardings, reference)
    state = jax.jit(lambda p: init_state(p, optimizer), out_shardings=shardings)(
        jax.device_put(params, shardings.params))
    del params

    def run(row_len, rows):
        start = time.perf_counter()
        batch = make_batch([[s] for s in rows], row_len, pad_id=d.pad_id, batch_size=d.batch_size)
        new_state, metrics = step_fn(state, put_batch(batch, mesh, rules))
        loss = float(metrics["loss/total"])
        return new_state, time.perf_counter() - start, loss, int((batch["segment"] >= 0).sum())

    warmup = {}
    for row_len, group in sorted(by_bucket.items()):
        state, seconds, _, _ = run(row_len, group[:d.batch_size])
        warmup[row_len] = seconds
    steps = []
    for k in np.random.default_rng(seed).permutation(len(batches)):
        row_len, rows = batches[k]
        state, seconds, loss, tokens = run(row_len, rows)
        if not math.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss} in a timed step (bucket {row_len})")
        steps.append(dict(row_len=row_len, rows=len(rows), tokens=tokens, seconds=seconds))
    seconds = sum(s["seconds"] for s in steps)
    return dict(batch_size=d.batch_size, ar_teacher=tcfg.loss.ar_teacher, examples=len(seqs), steps=steps,
                warmup_seconds=warmup, timed_seconds=seconds, seconds_per_example=seconds / len(seqs),
                tokens_per_second=sum(s["tokens"] for s in steps) / seconds,
                padded_tokens_per_second=sum(s["row_len"] * s["rows"] for s in steps) / seconds,
                bucket_seconds_per_example={
                    row_len: statistics.median(s["seconds"] / s["rows"] for s in steps if s["row_len"] == row_len)
                    for row_len in sorted(by_bucket)})


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


def main(argv=None) -> int:
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
    from jf_jax.training.loop import build_stream, model_config
    from jf_jax.training.packing import bucket_for

    first = next(iter(configs.values()))
    stream = build_stream(first, "", model_config(first).vocab_size, progress=False)
    multiple = math.lcm(*(c.data.batch_size for c in configs.values()))
    chosen = choose_examples([len(s) for s in stream.sequences], first.data.buckets, examples=args.examples,
                             multiple=multiple, seed=args.seed)
    counts: dict[int, int] = {}
    for i in chosen:
        b = bucket_for(len(stream.sequences[i]), first.data.buckets)
        counts[b] = counts.get(b, 0) + 1
    del stream
    report = dict(command="python experiments/bench_train_real.py " + " ".join(
        repr(a) if " " in a or ":" in a else a for a in (argv if argv is not None else sys.argv[1:])),
        bucket_counts=dict(sorted(counts.items())), variants={})
    for name, tcfg in configs.items():
        r = time_recipe(tcfg, chosen, seed=args.seed)
        report["variants"][name] = r
        print(f"{name}: batch {r['batch_size']}, teacher {r['ar_teacher']}: {r['seconds_per_example']:.2f} s/example, "
              f"{r['tokens_per_second']:.0f} packed tok/s; per bucket "
              + ", ".join(f"{b}: {s:.2f}" for b, s in r["bucket_seconds_per_example"].items()), flush=True)
    table = markdown(report)
    print(table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        args.json.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
