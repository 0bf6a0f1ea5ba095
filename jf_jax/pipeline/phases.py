"""A study's phases in order: pool -> collect -> train (and keep) -> evaluate -> commands -> report.

``run_study`` runs them (``--only`` picks some); ``show_plan`` prints what they would run (``--dry-run``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time

from jf_jax.pipeline import plan, runner
from jf_jax.pipeline.spec import Study
from jf_jax.training.trajectories import read_manifest

EXIT = {runner.OK: 0, runner.FAILED: 1, runner.STOPPED: 3, runner.INTERRUPTED: 130}
CONTINUE = ("run the same command again to continue: finished stages are skipped, collection resumes after its "
            "last complete shard, training from its last checkpoint")


def run_study(study: Study, configs: dict, phases: tuple[str, ...], time_limit_min: float | None = None,
              say=print) -> int:
    """Runs the chosen phases; the exit status: 0 done, 1 a stage failed, 3 stopped at the time limit, 130
    interrupted (SIGINT, SIGTERM, SIGHUP)."""
    deadline = None if time_limit_min is None else time.monotonic() + 60.0 * time_limit_min
    with runner.run_dir_lock(study.run_dir):
        run = runner.Runner(study.run_dir, os.path.join(study.run_dir, "logs", study.name), deadline, say)
        say(f"study {study.name}: state and logs in {study.run_dir}, results in {study.results}", flush=True)
        # The stages run in sessions of their own (the runner hands them its signal and waits for them to stop)
        previous = {s: signal.signal(s, run.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            outcome = _phases(study, configs, phases, run, say)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if outcome == runner.OK:
        say(f"study {study.name}: done; results in {study.results}")
    elif outcome == runner.FAILED:
        say(f"study {study.name}: a stage failed (above); once it is fixed, {CONTINUE}")
    else:
        why = f"the time limit ({time_limit_min:g} min)" if outcome == runner.STOPPED else "a signal"
        say(f"study {study.name}: stopped by {why}; {CONTINUE}")
    return EXIT[outcome]


def _phases(study: Study, configs: dict, phases: tuple[str, ...], run: runner.Runner, say) -> str:
    outcome = runner.OK
    for phase in plan.PHASES:
        if phase not in phases:
            continue
        if run.interrupted:  # a signal between two stages
            return runner.INTERRUPTED
        if phase == "pool":
            outcome = run.run(plan.pool_stage(study))
        elif phase == "collect" and study.collect:
            outcome = _collect(study, run, say)
        elif phase == "train" and study.arms:
            collected = collected_parts(study)
            if study.train.sizes:
                write_responses(study, collected)
            outcome = run.run(plan.train_stages(study, configs, collected), study.train.parallel)
            keep(study)
        elif phase == "evaluate":
            for evaluation in study.evaluations:
                outcome = run.run(plan.evaluate_stages(study, evaluation), evaluation.parallel)
                if outcome != runner.OK:
                    break
        elif phase == "commands":
            outcome = run.run(plan.command_stages(study))
        elif phase == "report" and study.report == "curve":
            from jf_jax.pipeline.curve import write_curve

            say("\n".join(write_curve(study.results) or [f"report: no eval_<point>.json in {study.results} yet"]))
        if outcome != runner.OK:
            return outcome
    return outcome


def _collect(study: Study, run: runner.Runner, say) -> str:
    """The parts not yet complete, ``workers`` at a time. With ``minutes``, collection is a box: when it ends,
    the complete shards are the data, and later runs go straight on to training."""
    stages = plan.collect_stages(study)
    box_key = "collection box " + hashlib.sha1("\n".join(map(runner.State.key, stages)).encode()).hexdigest()[:12]
    if box_key in run.state.done:
        return runner.OK
    todo = [s for s, p in zip(stages, plan.parts(study)) if not part_complete(p.dir)]
    minutes = study.collect.minutes
    outcome = run.run(todo, study.collect.workers, None if not minutes else time.monotonic() + 60.0 * minutes)
    if outcome == runner.BOXED:
        run.state.record(box_key, f"collection box of {minutes:g} min")
        say(f"  collection: its box of {minutes:g} min ended; training on the complete shards", flush=True)
        return runner.OK
    return outcome


def part_complete(part_dir: str) -> bool:
    if not os.path.exists(os.path.join(part_dir, "manifest.json")):
        return False
    manifest = read_manifest(part_dir)
    shards = manifest["shards"]
    return (shards[-1]["prompt_end"] if shards else 0) == manifest["num_prompts"]


def collected_parts(study: Study) -> dict[str, int]:
    """Responses kept (the repetition filter's survivors) in each part that holds shards, from its manifest."""
    kept = {}
    for part in plan.parts(study):
        if os.path.exists(os.path.join(part.dir, "manifest.json")):
            shards = read_manifest(part.dir)["shards"]
            if shards:
                kept[part.dir] = sum(s["prompt_end"] - s["prompt_start"] - s["num_filtered"] for s in shards)
    return kept


def write_responses(study: Study, collected: dict[str, int]) -> None:
    """``RESULTS/responses.json``: size -> responses its parts kept, the learning curve's x axis; sizes of other
    runs of the study (other machines, other ``--set train.sizes``) stay in it."""
    path = os.path.join(study.results, "responses.json")
    counts = {}
    if os.path.exists(path):
        with open(path) as f:
            counts = json.load(f)
    size = study.collect.part_size
    every = [p.dir for p in plan.parts(study)]
    for n in study.train.sizes:
        used = [p for p in every[:-(-n // size)] if p in collected]
        if used:
            counts[str(n)] = sum(collected[p] for p in used)
    os.makedirs(study.results, exist_ok=True)
    with open(path, "w") as f:
        json.dump(counts, f, indent=1)


def keep(study: Study) -> None:
    """The ``keep`` files of each trained run into the results folder (``FILE``, or ``<point>_FILE`` when the
    study trains several runs)."""
    trained = plan.points(study)
    for point in trained:
        for name in study.keep:
            source = os.path.join(point.run_dir, name)
            if os.path.exists(source):
                os.makedirs(study.results, exist_ok=True)
                shutil.copy2(source, os.path.join(study.results, name if len(trained) == 1 else f"{point.name}_{name}"))


def show_plan(study: Study, configs: dict, phases: tuple[str, ...], notes: list[str], say=print) -> int:
    """What ``run_study`` would run, each stage marked when it is done already; creates nothing."""
    state = runner.State(study.run_dir)
    collected = collected_parts(study)
    stages = {"pool": plan.pool_stage(study), "collect": plan.collect_stages(study),
              "train": plan.train_stages(study, configs, collected) if study.arms else [],
              "evaluate": [s for e in study.evaluations for s in plan.evaluate_stages(study, e)],
              "commands": plan.command_stages(study)}
    complete = {s.label for s, p in zip(stages["collect"], plan.parts(study)) if part_complete(p.dir)}
    say(f"study {study.name}: state and logs in {study.run_dir}, results in {study.results}")
    for note in notes:
        say(f"note: {note}")
    for phase in plan.PHASES:
        if phase not in phases:
            continue
        if phase == "report":
            if study.report:
                say(f"[report] {study.report} of {study.results}")
            continue
        for stage in stages[phase]:
            done = stage.label in complete or runner.stage_done(state, stage)
            say(f"[{phase}]{' (done)' if done else ''} {plan.shown(stage)}")
    return 0
