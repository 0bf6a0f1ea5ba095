"""Crash safety of checkpoints: ``python -m jf_jax.train`` killed with SIGKILL in the middle of writing a checkpoint
resumes, run again with the same command, to exactly the result of an uninterrupted run.

Orbax writes a checkpoint into ``STEP.orbax-checkpoint-tmp`` and renames it to ``STEP`` once complete, so the
half-written one must be ignored (the run restarts from the previous checkpoint, replays the same batches and
saves that step again). The kill is a real one from outside, and is checked to land mid-save: the test freezes the
process (SIGSTOP) as soon as a temporary checkpoint directory holds part of the state, kills it if that directory
is still there once the process is stopped, and otherwise lets it go on (SIGCONT) until the next save."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jf_jax.weights import run_dir as rd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_YAML = os.path.join(ROOT, "configs", "tiny.yaml")
# A checkpoint after every step (keep 2): eight saves (~0.1 s each here), the kill lands in one of steps 3-8.
OVERRIDES = ["train.steps=8", "train.ckpt_every=1", "train.keep_checkpoints=2", "data.synthetic.num_prompts=8",
             "optim.learning_rate=1e-2", "optim.warmup_steps=0"]
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax.checkpoint's temporary directories: STEP.orbax-checkpoint-tmp
FIRST_KILLED_STEP = 3  # so that the killed run has complete checkpoints to resume from
TIMEOUT_S = 300


def _command(run: str) -> list[str]:
    return [sys.executable, "-m", "jf_jax.train", TINY_YAML, "--run-dir", run, "--no-progress", *OVERRIDES]


def _train(run: str) -> str:
    proc = subprocess.run(_command(run), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _saving(ckpt_dir: str) -> list[str]:
    """Checkpoints of steps >= FIRST_KILLED_STEP being written, with part of the state written already: temporary
    directories that hold a file below the top level (not only orbax's first metadata file; lock files aside)."""
    found = []
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return found
    for name in names:
        if name.endswith(TMP_SUFFIX) and int(name[:-len(TMP_SUFFIX)]) >= FIRST_KILLED_STEP:
            top = os.path.join(ckpt_dir, name)
            if any(root != top and any(not f.endswith("__lock") for f in files) for root, _, files in os.walk(top)):
                found.append(name)
    return found


def _kill_mid_save(run: str) -> int:
    """Starts the training command and SIGKILLs it while it writes a checkpoint; returns that checkpoint's step."""
    ckpt_dir = os.path.join(run, rd.CHECKPOINT_DIR)
    log = open(run + ".log", "w")  # a file, not a pipe: output that nobody reads cannot block the run
    proc = subprocess.Popen(_command(run), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if not _saving(ckpt_dir):
                time.sleep(0.001)
                continue
            os.kill(proc.pid, signal.SIGSTOP)
            _, status = os.waitpid(proc.pid, os.WUNTRACED)  # returns once every thread of it is stopped
            assert os.WIFSTOPPED(status), f"the run ended while being stopped (wait status {status})"
            caught = _saving(ckpt_dir)
            if caught:  # still unfinished with the process frozen: the kill lands mid-save
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                assert proc.returncode == -signal.SIGKILL
                return int(caught[0][:-len(TMP_SUFFIX)])
            os.kill(proc.pid, signal.SIGCONT)  # the rename won the race: wait for the next save
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    with open(run + ".log") as f:
        output = f.read()
    pytest.fail(f"no checkpoint of steps {FIRST_KILLED_STEP}-8 was caught while being written "
                f"(return code {proc.returncode}):\n{output}")


def _metrics(run: str) -> list[dict]:
    with open(os.path.join(run, rd.METRICS_FILE)) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow  # three training processes of the tiny config (~30-60 s on 2 cores)
def test_run_killed_while_saving_a_checkpoint_resumes_exactly(tmp_path):
    killed = str(tmp_path / "killed")
    step = _kill_mid_save(killed)
    ckpt_dir = os.path.join(killed, rd.CHECKPOINT_DIR)
    names = os.listdir(ckpt_dir)
    assert f"{step}{TMP_SUFFIX}" in names, names  # the half-written checkpoint is left behind, never committed
    assert not os.path.exists(os.path.join(ckpt_dir, f"{step}{TMP_SUFFIX}", "commit_success.txt"))
    complete = sorted(int(n) for n in names if n.isdigit())
    assert complete and max(complete) < step, names  # only earlier checkpoints are complete
    assert max(m["step"] for m in _metrics(killed)) == step  # the step was logged, then killed while saving

    out = _train(killed)  # the same command resumes
    assert f"step {max(complete) + 1}/8" in out and "step 8/8" in out, out  # from the newest complete checkpoint
    assert sorted(os.listdir(ckpt_dir)) == ["7", "8"]  # no temporary directory left; keep-2

    full = str(tmp_path / "full")
    _train(full)
    assert _metrics(killed) == _metrics(full)  # every step's losses, grad norm and lr: bit-identical
    cfg_a, params_a = rd.load_run(full)
    cfg_b, params_b = rd.load_run(killed)
    assert cfg_a == cfg_b
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
