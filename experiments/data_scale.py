"""The data-scale study: held-out TPF against the number of training responses (the learning curve), and the same
pipeline at GPU size. One resumable command: re-running it skips every finished stage and resumes a killed one
(collection after its last complete shard, training from its last checkpoint). A point whose evaluation is in
``--results`` is not trained again, so the curve grows across machines whose ``--runs`` were lost.

    python experiments/data_scale.py --preset cpu      # the CPU learning curve: 250 .. 2,000 responses, two AR arms
    python experiments/data_scale.py --preset gpu      # one device: 6,144 responses, both arms, ~25 device minutes
    python experiments/data_scale.py --preset tiny     # the whole pipeline in minutes (what the test runs)

Stages, each a package command:
1. ``jf-jax prompts`` builds the prompt pool (train + held-out code and math) once.
2. ``jf-jax collect --batch-size B`` records the base model's trajectories in parts of ``--part-size`` prompts
   (part i takes prompts [i * part, (i + 1) * part) of train.jsonl), so a larger size reuses the smaller sizes' parts.
3. ``jf-jax train`` per (arm, size): the recipe of ``--config`` on the first size / part-size parts, for ``--epochs``
   passes over the responses kept (steps = epochs * responses / batch size). Arms: ``ce`` (the AR term is
   cross-entropy on the model's own greedy tokens, ``loss.ar_teacher=data``) and ``kl`` (KL to the frozen base,
   ``loss.ar_teacher=reference``). ``--epochs E`` other than the preset's trains the same data E times over, as a
   series of its own (``<arm>_e<E>``, e.g. ``ce_e4``): the curve's steps grow with its data, and this separates the
   two (the same steps spent on more passes over fewer responses).
4. ``jf-jax evaluate`` of the base model and of every trained run on the held-out prompts (jacobi and mr at the
   block size, loop-aware), and on as many training prompts (a gap: the model fits the prompts it trained on
   better than new ones; none: what it learned generalises).
5. ``jf-jax evaluate --humaneval-nll 164`` of the same models: the teacher-forced NLL of HumanEval's canonical
   solutions, the quality signal (pass@1 of a 135M model moves by a handful of problems; the NLL resolves what the
   fine-tune does to the model in a few minutes). A point whose run directory is gone is reported without it.
6. ``experiments/data_scale_report.py`` turns the evaluations into the curve (JSON, markdown, plot, fitted slope).

Everything lands under ``--runs`` (git-ignored) except the evaluations and the report, written to ``--results``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import importlib
import sys

from jf_jax import host_memory  # imports no JAX

if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # before JAX loads, as `jf-jax train` does

from jf_jax.cli.main import COMMANDS  # noqa: E402
from jf_jax.training.config import load_config  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Preset:
    sizes: tuple[int, ...]  # prompts collected for each point of the curve (responses = those the filter keeps)
    arms: tuple[str, ...]
    part_size: int
    second_arm_from: int = 0  # arms after the first train only at sizes >= this (the larger points of the curve)
    block_size: int = 16
    max_new_tokens: int = 256
    collect_batch: int = 16
    dtype: str = "bfloat16"
    epochs: float = 2.0
    eval_limit: int = 64  # prompts per evaluated file (held-out code, held-out math, training)
    eval_max_new_tokens: int = 256
    humaneval_nll: int = 164  # HumanEval problems whose canonical solutions' NLL scores a model
    config: str = "configs/data_scale.yaml"
    model: str = "smollm2-135m"
    train_overrides: tuple[str, ...] = ()


PRESETS = {
    # Two CPU cores decode ~15-20 tokens/s: 24 prompts per file and 128 tokens keep one evaluation near 15 minutes.
    # Batch 1: on a CPU the batched collector is slower than the one-prompt recorder (docs/training.md, Collect).
    "cpu": Preset(sizes=(250, 500, 1000, 2000), arms=("ce", "kl"), part_size=250, second_arm_from=1000,
                  collect_batch=1, eval_limit=24, eval_max_new_tokens=128),
    "gpu": Preset(sizes=(6144,), arms=("ce", "kl"), part_size=1024, collect_batch=128),
    "tiny": Preset(sizes=(4, 8), arms=("ce", "kl"), part_size=4, second_arm_from=8, block_size=4, max_new_tokens=16,
                   collect_batch=4,
                   epochs=1.0, eval_limit=2, eval_max_new_tokens=16, humaneval_nll=2,
                   train_overrides=("data.block_size=4", "data.window=2", "data.buckets=[512]", "data.batch_size=1",
                                    "model.remat=false", "train.ckpt_every=2")),
}
ARMS = {"ce": "loss.ar_teacher=data", "kl": "loss.ar_teacher=reference"}


class StageFailed(RuntimeError):
    pass


def jf(*args: str) -> None:
    """Runs ``jf-jax ARGS`` in this process: the stages share compiled programs (every evaluation decodes the same
    shapes, every training run compiles the same step), which a process per stage would compile again."""
    print("+ jf-jax", " ".join(args), flush=True)
    code = importlib.import_module(COMMANDS[args[0]][0]).main(list(args[1:]))
    if code:
        raise StageFailed(f"jf-jax {args[0]} exited with {code}")


def shard_size(preset: Preset) -> int:
    """Prompts per collection shard: one batch of the batched collector (so its AR pass decodes full batches), at
    least 16 (the one-prompt recorder's shards), at most a part."""
    return min(preset.part_size, max(16, preset.collect_batch))


def responses_in(parts: list[str]) -> int:
    """Responses the repetition filter kept in these trajectory directories, from their manifests (a shard's
    prompts less the ones it filtered; reading every record again for each size would be the same count)."""
    from jf_jax.training.trajectories import read_manifest

    return sum(s["prompt_end"] - s["prompt_start"] - s["num_filtered"] for p in parts
               for s in read_manifest(p)["shards"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--runs", default="runs/data_scale", help="prompts, trajectories and training runs (git-ignored)")
    p.add_argument("--results", default="results/studies/data_scale", help="evaluations and the report")
    p.add_argument("--sizes", help="comma list overriding the preset's sizes (prompts collected per point)")
    p.add_argument("--arms", help="comma list of arms (ce, kl) overriding the preset's")
    p.add_argument("--stages", default="prompts,collect,train,evaluate,nll,report")
    p.add_argument("--model", help="the base model spec (default: the preset's, the embedded SmolLM2-135M)")
    p.add_argument("--collect-batch", type=int, help="rows of the batched collector (default: the preset's)")
    p.add_argument("--worker", default="0/1", metavar="I/N",
                   help="collect only parts I, I+N, I+2N, ...: N processes (or devices, or machines) collecting one "
                        "curve side by side, each its own parts (a part is one trajectory directory); use with "
                        "--stages collect, and run the other stages once all parts are there")
    p.add_argument("--epochs", type=float,
                   help="passes over each point's responses (default: the preset's); another value makes its points "
                        "a series of their own, <arm>_e<E> (runs, evaluations and the report's rows)")
    p.add_argument("--prompt-dir", help="an existing prompt pool (train.jsonl, heldout_code.jsonl, "
                                        "heldout_math.jsonl) instead of building one under --runs")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.sizes:
        preset = dataclasses.replace(preset, sizes=tuple(int(s) for s in args.sizes.split(",")))
    if args.model:
        preset = dataclasses.replace(preset, model=args.model,
                                     train_overrides=(*preset.train_overrides, f"model.path={args.model}"))
    if args.arms:
        preset = dataclasses.replace(preset, arms=tuple(args.arms.split(",")))
    if args.collect_batch is not None:
        if args.collect_batch < 1:
            p.error(f"--collect-batch must be at least 1, got {args.collect_batch}")
        preset = dataclasses.replace(preset, collect_batch=args.collect_batch)
    series = ""  # appended to an arm's name to name its points (run directories, result files)
    if args.epochs is not None:
        if not (math.isfinite(args.epochs) and args.epochs > 0):
            p.error(f"--epochs must be a positive number, got {args.epochs}")
        if args.epochs != preset.epochs:
            series = f"_e{args.epochs:g}".replace(".", "p")
        preset = dataclasses.replace(preset, epochs=args.epochs)
    try:
        worker, workers = (int(x) for x in args.worker.split("/"))
    except ValueError:
        worker, workers = -1, 0
    if not 0 <= worker < workers:
        p.error(f"--worker is I/N with 0 <= I < N, got {args.worker!r}")
    unknown = set(preset.arms) - set(ARMS)
    if unknown:
        p.error(f"unknown arms {sorted(unknown)}; choose from {sorted(ARMS)}")
    stages = set(args.stages.split(","))
    results = os.path.join(args.results, args.preset)
    prompts = args.prompt_dir or os.path.join(args.runs, "prompts")
    os.makedirs(results, exist_ok=True)

    if "prompts" in stages and not args.prompt_dir and not os.path.exists(os.path.join(prompts, "manifest.json")):
        jf("prompts", "--out", prompts)
    num_parts = math.ceil(max(preset.sizes) / preset.part_size)
    parts = [os.path.join(args.runs, f"trajectories_n{preset.block_size}", f"part-{i:03d}") for i in range(num_parts)]
    if "collect" in stages:
        for i, part in list(enumerate(parts))[worker::workers]:
            jf("collect", "--model", preset.model, "--prompts", os.path.join(prompts, "train.jsonl"),
                   "--offset", str(i * preset.part_size), "--limit", str(preset.part_size), "--out", part,
                   "--block-size", str(preset.block_size), "--max-new-tokens", str(preset.max_new_tokens),
                   "--batch-size", str(preset.collect_batch), "--dtype", preset.dtype, "--repetition-filter",
                   "--prompts-per-shard", str(shard_size(preset)), "--no-progress")
    trained, kept = [], {}
    for size in preset.sizes:
        used = parts[: math.ceil(size / preset.part_size)]
        if all(os.path.exists(os.path.join(d, "manifest.json")) for d in used):
            kept[str(size)] = responses_in(used)
        for arm in preset.arms:
            if arm != preset.arms[0] and size < preset.second_arm_from:
                continue
            name = arm + series
            run_dir = os.path.join(args.runs, f"{name}-{size}")
            trained.append((name, size, run_dir, used))
            evaluated = os.path.exists(os.path.join(results, f"eval_{name}_{size}.json"))
            if "train" in stages and not evaluated and not os.path.exists(os.path.join(run_dir, "params")):
                batch = load_config(preset.config, ["data.path=[unused]", *preset.train_overrides]).data.batch_size
                steps = max(1, round(preset.epochs * kept[str(size)] / batch))
                jf("train", preset.config, "--run-dir", run_dir, f"data.path=[{','.join(used)}]",
                       f"train.steps={steps}", ARMS[arm], f"run_name=data_scale_{name}_{size}",
                       *preset.train_overrides, "--no-progress")
    counts = os.path.join(results, "responses.json")  # the report's x axis, kept across runs of other sizes
    if os.path.exists(counts):
        with open(counts) as f:
            kept = {**json.load(f), **kept}
    with open(counts, "w") as f:
        json.dump(kept, f, indent=1)
    models = [("base", 0, preset.model)] + [(arm, size, run_dir) for arm, size, run_dir, _ in trained]
    if "evaluate" in stages:
        for arm, size, model in models:
            out = os.path.join(results, f"eval_{arm}_{size}")
            if os.path.exists(out + ".json"):
                continue
            jf("evaluate", "--model", model, "--prompts", os.path.join(prompts, "heldout_code.jsonl"),
                   "--prompts", os.path.join(prompts, "heldout_math.jsonl"),
                   "--train-prompts", os.path.join(prompts, "train.jsonl"), "--limit", str(preset.eval_limit),
                   "--methods", "jacobi,mr", "--block-size", str(preset.block_size),
                   "--max-new-tokens", str(preset.eval_max_new_tokens), "--dtype", preset.dtype, "--out", out)
    if "nll" in stages:
        for arm, size, model in models:
            out = os.path.join(results, f"nll_{arm}_{size}")
            if os.path.exists(out + ".json"):
                continue
            if arm != "base" and not os.path.exists(os.path.join(model, "params")):
                print(f"nll: {model} holds no trained params; the {arm} {size} point is reported without its NLL")
                continue
            jf("evaluate", "--model", model, "--humaneval-nll", str(preset.humaneval_nll),
               "--dtype", preset.dtype, "--quality-dtype", preset.dtype, "--out", out)
    if "report" in stages:
        from data_scale_report import main as report  # the sibling script (this script's folder is on sys.path)

        if report(results):
            raise StageFailed(f"no evaluations to report in {results}")
    print(json.dumps(dict(preset=args.preset, results=results)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StageFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
