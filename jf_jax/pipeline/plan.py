"""A study as stages: each one ``jf-jax COMMAND ARGS`` (or a .py script) with the files that show it done.

Pure functions of the study (and, for training, of what collection kept): the runner decides what runs.

Names. Collection splits each source into parts of ``part_size`` prompts, ``RUN_DIR/<source dir>/part-NNN``, so
a larger size of a learning curve reuses a smaller one's parts. A trained model is a *point*: ``<arm>_<size>`` in
``RUN_DIR/<arm>-<size>`` when the study trains at several sizes, else ``<arm>`` in the arm's run directory; the
base model's point is ``base_0`` or ``base``. An evaluation of each model writes ``RESULTS/<name>_<point>``, one
of them all ``RESULTS/<name>`` (``.json`` and ``.md``, as ``jf-jax evaluate --out`` writes them).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex

from jf_jax.pipeline.spec import Arm, Env, Evaluation, Options, Study

PHASES = ("pool", "collect", "train", "evaluate", "commands", "report")


@dataclasses.dataclass(frozen=True)
class Stage:
    phase: str
    label: str  # names its log and its lines in the progress
    argv: tuple[str, ...]  # a jf-jax command, a python module or a .py script, and its arguments
    env: Env = ()
    outputs: tuple[str, ...] = ()  # files whose presence means its work is there (skipped, even with no state)
    run_dir: str | None = None  # training: the run, and the steps that finish it
    steps: int | None = None


@dataclasses.dataclass(frozen=True)
class Part:
    dir: str
    prompts: str
    offset: int
    limit: int


@dataclasses.dataclass(frozen=True)
class Point:
    arm: Arm
    size: int | None
    name: str
    run_dir: str
    parts: tuple[str, ...]  # the trajectory directories it trains on


def parts(study: Study) -> list[Part]:
    if study.collect is None:
        return []
    size = study.collect.part_size
    return [Part(dir=os.path.join(study.run_dir, s.dir, f"part-{i:03d}"),
                 prompts=os.path.join(study.pool.dir, s.prompts), offset=i * size, limit=min(size, s.limit - i * size))
            for s in study.collect.sources for i in range(math.ceil(s.limit / size))]


def points(study: Study) -> list[Point]:
    every = [p.dir for p in parts(study)]
    if study.train is None:
        return []
    if study.train.sizes is None:
        return [Point(arm=a, size=None, name=a.name, run_dir=a.run_dir, parts=tuple(every)) for a in study.arms]
    size = study.collect.part_size
    return [Point(arm=a, size=n, name=f"{a.name}_{n}", run_dir=os.path.join(study.run_dir, f"{a.name}-{n}"),
                  parts=tuple(every[:math.ceil(n / size)]))
            for n in study.train.sizes for a in study.arms if n >= a.from_size]


def pool_stage(study: Study) -> list[Stage]:
    if study.pool.build is None:
        return []
    return [Stage("pool", "prompts", ("prompts", "--out", study.pool.dir, *option_words(study.pool.build)),
                  outputs=(os.path.join(study.pool.dir, "manifest.json"),))]


def collect_stages(study: Study) -> list[Stage]:
    c = study.collect
    return [Stage("collect", f"collect {os.path.relpath(p.dir, study.run_dir)}",
                  ("collect", "--model", c.model, "--prompts", p.prompts, "--offset", str(p.offset), "--limit",
                   str(p.limit), "--out", p.dir, *option_words(c.options), "--no-progress"), env=c.env)
            for p in parts(study)] if c else []


def train_stages(study: Study, configs: dict, collected: dict[str, int]) -> list[Stage]:
    """``configs``: each arm's training config (``checks.arm_configs``); ``collected``: responses kept in each part
    directory that holds shards. A point trains on its parts that hold shards (all of them before collection,
    so that a plan can be shown), for ``epochs`` passes over their responses when the arm has epochs."""
    stages, t = [], study.train
    for point in points(study):
        cfg = configs[point.arm.name]
        used = [p for p in point.parts if p in collected] or list(point.parts)
        steps, words = cfg.train.steps, []
        if point.arm.epochs is not None:
            if all(p in collected for p in used):
                steps = max(1, round(point.arm.epochs * sum(collected[p] for p in used) / cfg.data.batch_size))
                words = [f"train.steps={steps}"]
            else:  # a plan before collection: the count is not known yet
                steps, words = None, [f"train.steps=<{point.arm.epochs:g} epochs of the responses collected>"]
        name = [f"run_name={study.name}_{point.name}"] if point.size is not None else []
        box = ["--stop-after-minutes", f"{t.minutes:g}", "--export-on-stop"] if t.minutes else []
        stages.append(Stage("train", f"train {point.name}",
                            ("train", t.config, "--run-dir", point.run_dir, f"data.path=[{','.join(used)}]",
                             *t.overrides, *point.arm.overrides, *words, *name, "--no-progress", *box),
                            env=t.env, outputs=evaluated(study, point.run_dir), run_dir=point.run_dir, steps=steps))
    return stages


def evaluate_stages(study: Study, evaluation: Evaluation) -> list[Stage]:
    runs = []
    models = model_points(study, evaluation)
    if evaluation.each:
        runs = [(f"{evaluation.name}_{label}", [spec]) for label, spec in models]
    else:
        runs = [(evaluation.name, [spec for _, spec in models])]
    return [Stage("evaluate", f"evaluate {name}",
                  ("evaluate", *[w for spec in specs for w in ("--model", spec)], *option_words(evaluation.options),
                   "--out", os.path.join(study.results, name)), env=evaluation.env,
                  outputs=(os.path.join(study.results, name + ".json"),))
            for name, specs in runs]


def command_stages(study: Study) -> list[Stage]:
    return [Stage("commands", f"command {i + 1} {os.path.basename(c.words[0])}", c.words,
                  outputs=(c.done_when_exists,) if c.done_when_exists else ())
            for i, c in enumerate(study.commands)]


def model_points(study: Study, evaluation: Evaluation) -> list[tuple[str, str]]:
    """(point name, model spec) of each model an evaluation names: "base", an arm (every point of it), a spec."""
    by_arm: dict[str, list[Point]] = {}
    for point in points(study):
        by_arm.setdefault(point.arm.name, []).append(point)
    base = "base_0" if study.train and study.train.sizes else "base"
    out = []
    for model in evaluation.models:
        if model == "base":
            out.append((base, study.model))
        elif model in {a.name for a in study.arms}:
            out += [(p.name, p.run_dir) for p in by_arm.get(model, [])]
        else:
            out.append((os.path.basename(os.path.normpath(model)), model))
    return out


def evaluated(study: Study, run_dir: str) -> tuple[str, ...]:
    """The outputs of every evaluation of the run in ``run_dir``: with all of them there, it need not be trained
    (the results folder is kept; runs/ may be gone)."""
    outputs = []
    for evaluation in study.evaluations:
        for stage in evaluate_stages(study, evaluation):
            if run_dir in stage.argv:
                outputs += stage.outputs
    return tuple(outputs)


def option_words(options: Options) -> list[str]:
    """``--name value`` per option; true is a bare flag, false leaves it out, a list repeats it."""
    words = []
    for name, value in options:
        for v in value if isinstance(value, tuple) else (value,):
            if v is True:
                words.append(f"--{name}")
            elif v is not False:
                words += [f"--{name}", str(v)]
    return words


def interpreter_args(argv: tuple[str, ...]) -> list[str]:
    """What comes between the Python interpreter and ``argv``: a .py script runs as it is, a dotted name as a
    module (``python -m``), anything else is a jf-jax command (``python -m jf_jax``)."""
    if argv[0].endswith(".py"):
        return []
    return ["-m"] if "." in argv[0] else ["-m", "jf_jax"]


def shown(stage: Stage) -> str:
    """The stage as a user would type it."""
    program = {0: "python", 1: "python -m", 2: "jf-jax"}[len(interpreter_args(stage.argv))]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in stage.env)
    return " ".join(filter(None, [env, program, shlex.join(stage.argv)]))
