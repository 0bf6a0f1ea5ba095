"""The real-batch train-step bench (``jf_jax.benchmarks.train_real``), run as its user runs it: the same real
examples timed at every recipe, whole batches only, and bad variants or too little data refused in one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_YAML = os.path.join(ROOT, "configs", "tiny.yaml")


def _bench(*args: str):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "jf_jax.benchmarks.train_real", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
    from jf_jax.training.trajectories import collect

    dirs = []
    for prompt_len, seed in ((8, 1), (20, 2)):  # two prompt lengths: two length buckets (40 and 52 tokens)
        dirs.append(str(tmp_path_factory.mktemp(f"traj{prompt_len}")))
        collect(make_prompts(6, prompt_len, 64, seed=seed), SyntheticRecorder(4, 4, 64), dirs[-1], block_size=4,
                progress=False)
    return [TINY_YAML, "data.source=trajectories", f"data.path=[{dirs[0]},{dirs[1]}]", "data.buckets=[48,64]"]


def test_recipes_time_the_same_examples(trajectories, tmp_path):
    out = tmp_path / "bench.json"
    proc = _bench(*trajectories, "--variant", "b1: data.batch_size=1",
                  "--variant", "b2_kl: data.batch_size=2 loss.ar_teacher=reference",
                  "--examples", "8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert sorted(report["bucket_counts"]) == ["48", "64"]
    assert all(n % 2 == 0 for n in report["bucket_counts"].values())  # whole batches of the largest batch size
    b1, b2 = report["variants"]["b1"], report["variants"]["b2_kl"]
    assert (b1["batch_size"], b2["batch_size"], b2["ar_teacher"]) == (1, 2, "reference (clean tokens)")
    assert b1["examples"] == b2["examples"] == sum(report["bucket_counts"].values())
    assert len(b1["steps"]) == 2 * len(b2["steps"]) and all(s["rows"] == 2 for s in b2["steps"])
    tokens = [sum(s["tokens"] for s in r["steps"]) for r in (b1, b2)]
    assert tokens[0] == tokens[1] > 0  # the same packed responses, no empty rows
    assert np.isclose(b2["seconds_per_example"], b2["timed_seconds"] / b2["examples"])
    table = out.with_suffix(".md").read_text()
    assert "| b2_kl | 2 | reference (clean tokens) |" in table and "s / ex. @64" in table


def test_too_few_examples_for_whole_batches_is_one_error_line(trajectories, tmp_path):
    proc = _bench(*trajectories, "--variant", "b64: data.batch_size=64", "--examples", "8",
                  "--json", str(tmp_path / "b.json"))
    assert proc.returncode == 2 and "too few sequences" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_variant_is_a_clear_error():
    proc = _bench(TINY_YAML, "--variant", "no colon")
    assert proc.returncode == 2 and "NAME" in proc.stderr
    # refused before any trajectory is read: the variants would time other examples
    proc = _bench(TINY_YAML, "data.source=trajectories", "data.path=/nonexistent", "--variant", "a:",
                  "--variant", "b: data.window=2")
    assert proc.returncode == 2 and "['b'] change the data or its packing" in proc.stderr
