"""experiments/bench_train_real.py: the same real examples timed at every recipe, whole batches only."""

import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_YAML = os.path.join(ROOT, "configs", "tiny.yaml")


def test_choose_examples_keeps_whole_batches_per_bucket():
    from experiments.bench_train_real import choose_examples
    from jf_jax.training.packing import bucket_for

    lengths = [40] * 7 + [60] * 5 + [10]  # buckets 48 (7 sequences), 64 (5), 16 (1)
    chosen = choose_examples(lengths, [16, 48, 64], examples=8, multiple=4, seed=0)
    per_bucket = {b: sum(1 for i in chosen if bucket_for(lengths[i], [16, 48, 64]) == b) for b in (16, 48, 64)}
    assert len(set(chosen)) == len(chosen)
    assert per_bucket == {16: 0, 48: 4, 64: 4}  # whole batches of 4 only: the lone 10-token sequence is left out
    with pytest.raises(ValueError, match="too few sequences"):
        choose_examples([40, 60], [48, 64], examples=4, multiple=4, seed=0)


def test_recipes_time_the_same_examples(tmp_path):
    from experiments.bench_train_real import main
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
    from jf_jax.training.trajectories import collect

    dirs = []
    for prompt_len, seed in ((8, 1), (20, 2)):  # two prompt lengths: two length buckets (40 and 52 tokens)
        dirs.append(str(tmp_path / f"traj{prompt_len}"))
        collect(make_prompts(6, prompt_len, 64, seed=seed), SyntheticRecorder(4, 4, 64), dirs[-1], block_size=4,
                progress=False)
    out = tmp_path / "bench.json"
    assert main([TINY_YAML, "data.source=trajectories", f"data.path=[{dirs[0]},{dirs[1]}]", "data.buckets=[48,64]",
                 "--variant", "b1: data.batch_size=1",
                 "--variant", "b2_kl: data.batch_size=2 loss.ar_teacher=reference",
                 "--examples", "8", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert sorted(report["bucket_counts"]) == ["48", "64"]
    assert all(n % 2 == 0 for n in report["bucket_counts"].values())
    b1, b2 = report["variants"]["b1"], report["variants"]["b2_kl"]
    assert (b1["batch_size"], b2["batch_size"], b2["ar_teacher"]) == (1, 2, "reference (clean tokens)")
    assert b1["examples"] == b2["examples"] == sum(report["bucket_counts"].values())
    assert len(b1["steps"]) == 2 * len(b2["steps"]) and all(s["rows"] == 2 for s in b2["steps"])
    tokens = [sum(s["tokens"] for s in r["steps"]) for r in (b1, b2)]
    assert tokens[0] == tokens[1] > 0  # the same packed responses, no empty rows
    assert np.isclose(b2["seconds_per_example"], b2["timed_seconds"] / b2["examples"])
    table = out.with_suffix(".md").read_text()
    assert "| b2_kl | 2 | reference (clean tokens) |" in table and "s / ex. @64" in table


def test_bad_variant_is_a_clear_error(capsys):
    from experiments.bench_train_real import main

    with pytest.raises(SystemExit):
        main([TINY_YAML, "--variant", "no colon"])
    assert "NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused before any trajectory is read: the variants would time other examples
        main([TINY_YAML, "data.source=trajectories", "data.path=/nonexistent", "--variant", "a:",
              "--variant", "b: data.window=2"])
    assert "['b'] change the data or its packing" in capsys.readouterr().err
