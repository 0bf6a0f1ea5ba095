"""The data-scale study (experiments/data_scale.py) end to end at tiny size, with a tiny GGUF model: batched
collection -> training (the cross-entropy arm at two sizes, the KL arm at the larger) -> loop-aware evaluation ->
the learning-curve report, and a longer-trained series (``--epochs``). Run as a subprocess, as a user runs it;
re-running it does no stage twice."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from jf_jax.data import humaneval
from tests.support.data_wheels import real_wheel
from tests.support.gguf_models import tiny_model, write_gguf

pytestmark = pytest.mark.slow  # three training runs and four evaluations in one process: ~2 minutes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(prefix, count, domain):
    return [dict(id=f"{prefix}{i}", domain=domain, prompt=f"abc {prefix} {i} " * 2, answer=str(i))
            for i in range(count)]


def _write(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_the_tiny_study_runs_end_to_end_and_resumes(tmp_path):
    real_wheel(humaneval.fetch)  # the NLL stage scores HumanEval's solutions
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    _write(prompts / "train.jsonl", _rows("t", 8, "code"))
    _write(prompts / "heldout_code.jsonl", _rows("c", 2, "code"))
    _write(prompts / "heldout_math.jsonl", _rows("m", 2, "math"))
    model = write_gguf(tmp_path / "tiny.gguf", tiny_model("llama", seed=0))
    results = tmp_path / "results"
    cmd = [sys.executable, "experiments/data_scale.py", "--preset", "tiny", "--model", str(model),
           "--prompt-dir", str(prompts), "--runs", str(tmp_path / "runs"), "--results", str(results)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("+ jf-jax train") == 3 and done.stdout.count("+ jf-jax evaluate") == 8  # 4 speed, 4 NLL
    curve = json.loads((results / "tiny" / "curve.json").read_text())
    assert sorted((p["arm"], p["size"]) for p in curve["points"]) == [("base", 0), ("ce", 4), ("ce", 8), ("kl", 8)]
    for point in curve["points"]:
        for method in ("jacobi n=4", "mr n=4"):
            held = point["methods"][method]["heldout"]
            assert held["prompts"] == 4 and 0.0 <= held["loop_rate"] <= 1.0
            assert point["methods"][method]["train"]["prompts"] == 2
    assert curve["fits"]["ce jacobi n=4"]["points"] == curve["fits"]["ce mr n=4"]["points"] == 2
    assert curve["fits"]["kl jacobi n=4"] is None  # one point: no slope
    assert all(p["humaneval_nll"]["problems"] == 2 and p["humaneval_nll"]["nll_per_token"] > 0
               for p in curve["points"])
    changes = [p["humaneval_nll"]["change_from_base"] for p in curve["points"] if p["arm"] != "base"]
    assert len(changes) == 3 and all(c["problems"] == 2 and c["ci95"][0] <= c["mean"] <= c["ci95"][1]
                                     for c in changes)
    assert (results / "tiny" / "curve.png").stat().st_size > 0
    # The same command again finds every stage done: nothing is collected, trained or evaluated twice.
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "+ jf-jax train" not in again.stdout and "+ jf-jax evaluate" not in again.stdout
    # A machine that lost the trained runs (runs/ is not committed) and asks for one size: the evaluated points
    # are not trained again, and the responses of the sizes it did not ask for stay on the curve's x axis.
    for run in ("ce-4", "ce-8", "kl-8"):
        shutil.rmtree(tmp_path / "runs" / run)
    third = subprocess.run(cmd + ["--sizes", "8"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "+ jf-jax train" not in third.stdout
    assert sorted(json.loads((results / "tiny" / "responses.json").read_text())) == ["4", "8"]
    # The same data trained twice as long (the tiny preset's epochs are 1): a series of its own, twice the steps.
    steps = int(done.stdout.split("run_name=data_scale_ce_4")[0].rsplit("train.steps=", 1)[1].split()[0])
    longer = subprocess.run(cmd + ["--sizes", "4", "--arms", "ce", "--epochs", "2", "--stages", "train"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert longer.returncode == 0, longer.stdout[-3000:] + longer.stderr[-3000:]
    assert longer.stdout.count("+ jf-jax train") == 1 and f"train.steps={2 * steps} " in longer.stdout
    assert "run_name=data_scale_ce_e2_4 " in longer.stdout and (tmp_path / "runs" / "ce_e2-4" / "params").exists()


def test_the_report_reads_an_epochs_series_as_an_arm_of_its_own(tmp_path):
    """``--epochs`` names a point ``<arm>_e<E>`` (``eval_ce_e2_250.json``): the report's point is the arm
    ``ce_e2`` at 250, with that arm's NLL file, not ``ce`` at ``e2_250``."""
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    from data_scale_report import read_point

    cpu = os.path.join(ROOT, "results", "studies", "data_scale", "cpu")
    shutil.copy(os.path.join(cpu, "eval_ce_250.json"), tmp_path / "eval_ce_e2_250.json")
    shutil.copy(os.path.join(cpu, "nll_ce_250.json"), tmp_path / "nll_ce_e2_250.json")
    point = read_point(str(tmp_path / "eval_ce_e2_250.json"))
    assert (point["arm"], point["size"]) == ("ce_e2", 250)
    assert point["humaneval_nll"] is not None and point["humaneval_nll"]["problems"] == 164
    assert {"jacobi n=16", "mr n=16"} <= set(point["methods"])
