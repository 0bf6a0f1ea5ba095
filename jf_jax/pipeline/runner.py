"""Runs a study's stages as subprocesses: resumable, time-boxed, one log per stage.

Each finished stage is recorded in ``RUN_DIR/study-state.json`` (written to a temporary file and renamed), keyed
by its full command, so running the same study again skips it, and a stage whose command changed runs again. A
stage stopped part-way is not recorded: run again, the command resumes its own work (collection after its last
complete shard, training from its last checkpoint). An evaluation whose output is in the results folder counts
as done without the state, and so does the training of a model whose every evaluation is there: the results
folder is kept, ``runs/`` is not.

The stages share one XLA compilation cache (``RUN_DIR/xla_cache`` unless ``JAX_COMPILATION_CACHE_DIR`` is set),
so a program compiled by one process is loaded by the next instead of compiled again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

from jf_jax.pipeline.plan import Stage, interpreter_args, shown

GRACE_S = 60.0  # after SIGINT, before SIGKILL: a collector finishes its shard's write, training its checkpoint
POLL_S = 0.2
TRAIN_MARGIN_MIN = 1.0  # a training run's own stop comes this long before the time limit (loading, the last save)

OK, FAILED, STOPPED, BOXED, INTERRUPTED = "ok", "failed", "stopped", "boxed", "interrupted"


class State:
    """The stages a run directory has finished, by command."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, "study-state.json")
        self.done: dict[str, dict] = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.done = json.load(f)["done"]

    @staticmethod
    def key(stage: Stage) -> str:
        return shown(stage)

    def record(self, key: str, label: str, **facts) -> None:
        self.done[key] = dict(label=label, finished=time.strftime("%Y-%m-%dT%H:%M:%S"), **facts)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(done=self.done), f, indent=1)
        os.replace(tmp, self.path)


@contextlib.contextmanager
def run_dir_lock(run_dir: str):
    """One study command at a time per run directory (two collectors on one part would write the same shards)."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, ".study.lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another `jf-jax study` is running in {run_dir}") from None
        yield


class Runner:
    """Starts stages, watches the time limit and Ctrl-C, and records what finished."""

    def __init__(self, run_dir: str, log_dir: str, deadline: float | None, say=print):
        self.state = State(run_dir)
        self.log_dir = log_dir
        self.deadline = deadline
        self.say = say
        self.interrupted = False
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.abspath(os.path.join(run_dir, "xla_cache")))
        self.env = env
        os.makedirs(log_dir, exist_ok=True)

    def on_signal(self, signum, frame) -> None:
        self.interrupted = True

    def run(self, stages: list[Stage], parallel: int = 1, box_end: float | None = None) -> str:
        """Runs the stages not done, ``parallel`` at a time. OK when all finished; STOPPED at the time limit and
        BOXED at ``box_end`` (the stages cut there resume next time); FAILED when one failed (the others are let
        finish); INTERRUPTED after a signal."""
        pending = [s for s in stages if not stage_done(self.state, s)]
        running: dict[subprocess.Popen, tuple[Stage, float, bool]] = {}
        outcome, stop_sent = OK, None
        while pending or running:
            now = time.monotonic()
            limit = self.deadline is not None and now >= self.deadline
            cut = self.interrupted or limit or (box_end is not None and now >= box_end)
            if cut and stop_sent is None:
                outcome = INTERRUPTED if self.interrupted else STOPPED if limit else BOXED
                pending, stop_sent = [], now
                for proc in running:
                    _signal(proc, signal.SIGINT)
            elif stop_sent is not None and now - stop_sent > GRACE_S:
                for proc in running:
                    _signal(proc, signal.SIGKILL)
            while outcome == OK and pending and len(running) < parallel:
                stage = pending.pop(0)
                proc, box_governs = self._start(stage)
                running[proc] = (stage, time.monotonic(), box_governs)
            for proc in [p for p in running if p.poll() is not None]:
                stage, started, box_governs = running.pop(proc)
                result = self._finished(stage, proc.returncode, time.monotonic() - started, box_governs,
                                        cut=stop_sent is not None)
                if result != OK and outcome == OK:
                    outcome, pending = result, []
            time.sleep(POLL_S if running else 0)
        return outcome

    def _start(self, stage: Stage) -> tuple[subprocess.Popen, bool]:
        argv, box_governs = list(stage.argv), "--export-on-stop" in stage.argv
        if stage.phase == "train" and self.deadline is not None:  # stop cleanly, checkpointed, before the limit
            left = max(0.1, (self.deadline - time.monotonic()) / 60 - TRAIN_MARGIN_MIN)
            if "--stop-after-minutes" in argv:
                i = argv.index("--stop-after-minutes") + 1
                box_governs = float(argv[i]) <= left
                argv[i] = f"{min(float(argv[i]), left):g}"
            else:
                argv += ["--stop-after-minutes", f"{left:g}"]
        self.say(f"+ {shown(stage)}", flush=True)
        program = [sys.executable, *interpreter_args(stage.argv)]
        with open(self.log_path(stage), "a") as log:
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shown(stage)}\n")
            log.flush()
            proc = subprocess.Popen(program + argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(self.env, **dict(stage.env)), start_new_session=True)
        return proc, box_governs

    def _finished(self, stage: Stage, rc: int, seconds: float, box_governs: bool, cut: bool) -> str:
        with open(os.path.join(self.log_dir, "stages.jsonl"), "a") as f:
            f.write(json.dumps(dict(label=stage.label, rc=rc, seconds=round(seconds, 1), cut=cut)) + "\n")
        complete = rc == 0 and (stage.phase != "train" or box_governs or _trained(stage))
        if complete:
            self.state.record(State.key(stage), stage.label, seconds=round(seconds, 1))
            self.say(f"  {stage.label}: done in {seconds:.0f} s", flush=True)
            return OK
        if cut or rc == 0:  # stopped by the limit, by Ctrl-C, or training stopped itself before the limit
            self.say(f"  {stage.label}: stopped after {seconds:.0f} s (resumes next time)", flush=True)
            return STOPPED
        self.say(f"error: {stage.label} failed (exit {rc}) after {seconds:.0f} s; the end of its log "
                 f"{self.log_path(stage)}:\n{_tail(self.log_path(stage))}", file=sys.stderr, flush=True)
        return FAILED

    def log_path(self, stage: Stage) -> str:
        return os.path.join(self.log_dir, stage.label.replace("/", "-").replace(" ", "-") + ".log")


def stage_done(state: State, stage: Stage) -> bool:
    """Recorded as finished with this very command, or its outputs are there."""
    return State.key(stage) in state.done or bool(stage.outputs) and all(map(os.path.exists, stage.outputs))


def _trained(stage: Stage) -> bool:
    """Whether the training run reached its last step (a run stopped by the time limit exits 0 before it)."""
    from jf_jax.weights.run_dir import read_metrics

    rows = read_metrics(stage.run_dir)
    return stage.steps is not None and bool(rows) and rows[-1].get("step", 0) >= stage.steps


def _signal(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as f:
        return "\n".join("    " + line for line in f.read().splitlines()[-lines:])
