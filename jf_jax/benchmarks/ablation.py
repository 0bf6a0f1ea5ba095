"""Lever ablations for Jacobi Forcing on a real model: short training runs that differ in one setting each,
every one measured the same way (held-out Jacobi TPF), in one process so the decoding programs compile once.

    PYTHONPATH=. python experiments/ablate.py configs/smollm2_jf.yaml --steps 60 \\
        --variant "ar_only: loss.consistency_weight=0" --variant "ref: loss.consistency_weight=1" \\
        --variant "cw20: loss.consistency_weight=20" \\
        --prompts runs/prompts/code_heldout.jsonl --prompts runs/prompts/math_heldout.jsonl --limit 3 \\
        --out results/studies/levers_n8/ablation

Each --variant is "NAME: key=value key=value ..." (overrides applied after --steps and the shared overrides);
"base" is always measured first (the untrained model of the config's model.path). Every variant trains into
runs/ablation/NAME (its checkpoints are deleted after the final parameters are exported, to save disk) and is
then decoded greedily with Jacobi (block size = the config's data.block_size) on the held-out prompts; with
--humaneval-nll K, also scored by the teacher-forced NLL of the first K HumanEval reference solutions
(``eval.quality.humaneval_answer_nll``: the quality signal short runs can resolve). Results
are appended to OUT.jsonl as each variant finishes, so a killed sweep resumes with the variants still missing;
OUT.md holds the table and OUT.png the TPF bars (``lever_plot`` draws several tables' TPF against NLL).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import time

from jf_jax import host_memory  # imports no JAX
from jf_jax.data.build import read_jsonl  # imports no JAX

VARIANT_HEADER, NLL_HEADER = "variant", "HumanEval NLL"
"""Headers of the table's name and quality columns (the TPF column's is ``stats_table``'s), read by
``read_table``."""


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name or any(c in name for c in "/ ") or name == "base":
        raise ValueError(f"--variant must look like 'NAME: key=value ...' with a plain NAME other than 'base', "
                         f"got {text!r}")
    return name, rest.split()


def measure_tpf(model, prompts: list[list[int]], *, block_size: int, max_new_tokens: int) -> dict:
    """Greedy Jacobi on the prompts, one at a time: the evaluation's own timed run (``eval.speed.speed_run``:
    the loop rule's statistics, the per-prompt records and the tokens)."""
    from jf_jax.eval.speed import speed_run

    return speed_run(model, "jacobi", prompts, max_new_tokens=max_new_tokens, options=dict(block_size=block_size))


def mean_losses(run_dir: str, last: int) -> dict:
    from jf_jax.weights.run_dir import read_metrics

    tail = read_metrics(run_dir)[-last:]
    return {k: statistics.fmean(r[k] for r in tail) for k in ("loss/ar", "loss/consistency", "loss/total")}


def markdown(rows: list[dict], header: str) -> str:
    """The variants' table (``eval.stats_table``): the statistics under the schema's headers, then this
    study's own columns. Rows resumed from an older OUT.jsonl lack the loop fields: those cells read "-"."""
    from jf_jax.decoding.stats import match_fraction
    from jf_jax.eval.stats_table import Column, render_table

    base = next((r for r in rows if r["name"] == "base"), None)
    table = [dict(r, overrides=" ".join(r["overrides"]) or "-",
                  vs_base=r["tpf"] / base["tpf"] if base else None,
                  same_as_base=match_fraction(r["token_ids"], base["token_ids"]) if base else None) for r in rows]
    columns = [Column("name", VARIANT_HEADER), "overrides", "tpf", Column("vs_base", "vs base", ".3f"), "mean_tpf",
               "mean_tpf_ci95", "loop_rate", "without_loops.mean_tpf", Column("losses.loss/ar", "loss/ar", ".3f"),
               Column("losses.loss/consistency", "loss/consistency", ".3f"),
               Column("train_seconds", "train s", ".0f"), Column("same_as_base", "same as base", ".2f")]
    if any("humaneval_nll" in r for r in rows):
        columns.append(Column("humaneval_nll", NLL_HEADER, ".3f"))
    return header + "\n\n" + render_table(table, columns) + "\n"


def read_table(path: str) -> list[dict]:
    """Rows of a table ``markdown`` wrote: name, TPF and HumanEval NLL (the table needs that column)."""
    from jf_jax.eval.stats_table import column

    with open(path) as f:
        lines = [ln.strip() for ln in f if ln.startswith("|")]
    if len(lines) < 3:
        raise ValueError(f"{path}: no markdown table")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    if NLL_HEADER not in header:
        raise ValueError(f"{path}: the table has no {NLL_HEADER} column (run ablate.py with --humaneval-nll K)")
    rows = []
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows.append(dict(name=cells[VARIANT_HEADER], tpf=float(cells[column("tpf").header]),
                         nll=float(cells[NLL_HEADER])))
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2, 3.2))
    ax.bar([r["name"] for r in rows], [r["tpf"] for r in rows], color="tab:blue")
    ax.axhline(rows[0]["tpf"], color="grey", lw=1, ls="--")
    ax.set_ylabel("held-out Jacobi TPF")
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None, program: str = "python -m jf_jax.benchmarks.ablation") -> int:
    """The command line above; ``program`` is how the table's command line names what ran."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="key=value overrides shared by every variant")
    p.add_argument("--variant", action="append", default=[], help="'NAME: key=value ...' (repeatable)")
    p.add_argument("--steps", type=int, required=True, help="training steps of every variant")
    p.add_argument("--prompts", action="append", required=True, help="held-out JSONL (repeatable)")
    p.add_argument("--limit", type=int, default=3, help="prompts per --prompts file")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--humaneval-nll", type=int, default=0, metavar="K",
                   help="also score the NLL of the first K HumanEval reference solutions (0: off; 164: all)")
    p.add_argument("--runs", default="runs/ablation", help="parent directory of the variants' run dirs")
    p.add_argument("--out", required=True, help="output path without extension (.jsonl, .md, .png)")
    args = p.parse_intermixed_args(argv)  # overrides may follow the options, as in train.py
    try:
        variants = [parse_variant(v) for v in args.variant]
    except ValueError as e:
        p.error(str(e))

    from jf_jax.api import encode_prompts, load_model
    from jf_jax.training.config import ConfigKeyError, load_config
    from jf_jax.training.loop import run_training

    shared = [f"train.steps={args.steps}", f"train.ckpt_every={args.steps}", "train.keep_checkpoints=1",
              *args.overrides]
    for path in args.prompts:
        if not os.path.isfile(path):
            p.error(f"--prompts {path}: no such file (python -m jf_jax.prompts builds runs/prompts)")
    try:  # every variant's config is checked before the first one trains
        tcfg = load_config(args.config, shared)
        configs = {name: load_config(args.config, shared + overrides) for name, overrides in variants}
    except (ConfigKeyError, OSError) as e:
        p.error(str(e))
    from jf_jax.training.config import check_before_training
    from jf_jax.training.trajectories import TrajectoryFormatError
    from jf_jax.weights import WeightsError

    if not tcfg.model.path:
        p.error(f"{args.config}: no model.path; the ablation starts from a real base model (e.g. smollm2-135m)")
    try:  # every variant's data and mesh, and the base model's spec, before the base model is measured
        for cfg in (tcfg, *configs.values()):
            check_before_training(cfg)
        base_model = load_model(tcfg.model.path)
    except (ConfigKeyError, TrajectoryFormatError, WeightsError) as e:
        p.error(str(e))
    n = tcfg.data.block_size
    rows_in = [r for f in args.prompts for r in read_jsonl(f)[: args.limit]]
    prompts = encode_prompts(base_model, [r["prompt"] for r in rows_in])
    problems = []
    if args.humaneval_nll > 0:
        from jf_jax.data import humaneval as he

        problems = he.load_problems(he.fetch())[: args.humaneval_nll]

    def quality(model) -> dict:
        if not problems:
            return {}
        from jf_jax.eval.quality import humaneval_answer_nll

        return dict(humaneval_nll=humaneval_answer_nll(model, problems)["nll_per_token"])

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    done = {}
    if os.path.exists(args.out + ".jsonl"):
        with open(args.out + ".jsonl") as f:
            done = {r["name"]: r for r in map(json.loads, f) if r.get("steps") == args.steps}

    def record(row: dict) -> None:
        done[row["name"]] = row
        with open(args.out + ".jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['name']}: TPF {row['tpf']:.3f}", {k: round(v, 3) for k, v in (row.get("losses") or {}).items()},
              {k: round(row[k], 3) for k in ("humaneval_nll",) if k in row}, flush=True)

    if "base" not in done:
        record(dict(name="base", overrides=[], steps=args.steps, **quality(base_model),
                    **measure_tpf(base_model, prompts, block_size=n, max_new_tokens=args.max_new_tokens)))
    del base_model
    for name, overrides in variants:
        if name in done:
            continue
        run = os.path.join(args.runs, name)
        cfg = configs[name]
        start = time.perf_counter()
        run_training(cfg, run)
        seconds = time.perf_counter() - start
        shutil.rmtree(os.path.join(run, "checkpoints"), ignore_errors=True)
        model = load_model(run)
        record(dict(name=name, overrides=overrides, steps=args.steps, train_seconds=seconds,
                    losses=mean_losses(run, max(1, args.steps // 5)), **quality(model),
                    **measure_tpf(model, prompts, block_size=cfg.data.block_size,
                                  max_new_tokens=args.max_new_tokens)))
    order = ["base"] + [name for name, _ in variants]
    rows = [done[name] for name in order if name in done]
    header = (f"# Ablation: {args.steps} steps per variant from {args.config} {' '.join(args.overrides)}\n\n"
              f"Held-out Jacobi TPF (tokens / forwards, prefill counted) on {len(prompts)} prompts "
              f"({', '.join(args.prompts)}; first {args.limit} each), {args.max_new_tokens} new tokens, greedy, "
              f"float32, CPU ({time.strftime('%Y-%m-%d %H:%M')}). Losses: mean of the last fifth of the steps "
              f"(loss/ar is the cross-entropy on the trajectory's tokens, or with loss.ar_teacher=reference the KL "
              f"to the frozen base model). "
              "'same as base': fraction of prompts whose greedy output equals the untrained model's. TPF "
              "(mean/prompt) with its bootstrap 95% interval; an answer loops when it ran to the token cap with at "
              "least half of its 4-grams repeats (docs/method.md, section 8), and 'without loops' leaves those "
              "answers out."
              + (f" HumanEval NLL: nats per token of the first {args.humaneval_nll} reference solutions, "
                 f"teacher-forced." if args.humaneval_nll > 0 else "")
              + f"\n\nCommand: `{program} {shlex.join(sys.argv[1:] if argv is None else argv)}`")
    with open(args.out + ".md", "w") as f:
        f.write(markdown(rows, header))
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.md and {args.out}.png")
    return 0


if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # before JAX loads: XLA's per-step buffers reused, not re-faulted
    sys.exit(main())
