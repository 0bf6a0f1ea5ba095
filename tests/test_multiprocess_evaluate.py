"""A multi-process evaluation (``jf-jax evaluate --distributed``): each process evaluates a contiguous share of every
set, writes it to its part, and process 0 merges the parts into the report one process writes: every statistic that
does not depend on the clock is the one-process run's. Each process resumes from its own part, and a report or
parts of another process count are refused before any model loads."""

import json
import os
import subprocess
import sys

import pytest

from jf_jax.decoding.stats import TIMING_KEYS
from jf_jax.eval.parts import Process, merge_results, share
from tests.support.processes import jf_jax_pair, run_pair
from tests.test_collect_eval import ROWS, FakeModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOCKED = (*TIMING_KEYS, "speedup_vs_ar", "speedup_vs_ar_excl_prefill", "seconds")
"""What a run's clock sets: the only fields a multi-process report may differ in from a one-process one."""


def _unclocked(value):
    """``value`` (a result, or any part of one) without the fields the clock sets."""
    if isinstance(value, dict):
        return {k: _unclocked(v) for k, v in value.items() if k not in CLOCKED}
    if isinstance(value, list):
        return [_unclocked(v) for v in value]
    return value


@pytest.mark.parametrize("total, count, unit", [(t, c, u) for t in (0, 1, 5, 12) for c in (1, 2, 3, 5)
                                                for u in (1, 2, 4)])
def test_shares_cover_a_set_in_order_in_whole_groups(total, count, unit):
    shares = [share(total, Process(i, count), unit) for i in range(count)]
    assert sum(s.count for s in shares) == total and shares[0].first == 0
    for before, after in zip(shares, shares[1:]):
        assert after.first == before.first + before.count  # contiguous, in process order
    assert all(s.first % unit == 0 for s in shares if s.count)  # a decoding batch is never split
    assert max(s.count for s in shares) - min(s.count for s in shares) <= unit  # as even as whole groups allow


@pytest.mark.slow  # the tiny model's decoders compile (~10 s)
def test_merged_parts_are_the_one_process_result(tmp_path):
    from jf_jax.decoding.sampling import Sampling
    from jf_jax.eval.evaluation import evaluate_model

    model = FakeModel()
    math = [dict(r, prompt=r["prompt"][:12]) for r in ROWS[:3]]
    options = dict(methods=["ar", "jacobi"], block_sizes=(4,), max_new_tokens=6, math_max_new_tokens=4, math_batch=2,
                   model=model, sampling=Sampling(temperature=1.0), seed=3)  # drafts and samples keyed by prompt

    def evaluate(process):
        return evaluate_model("tiny", {"held": ROWS, "seen": ROWS[3:]}, math, process=process, **options)

    one = evaluate(Process())
    for count in (2, 3):  # 3: the second prompt set and the GSM batches leave a process without a share
        merged = merge_results([dict(evaluate(Process(i, count)), seconds=1.0) for i in range(count)])
        assert _unclocked(merged) == _unclocked(one)
        assert [cell["tpf"] for cell in merged["speed"]["held"].values()] == [
            cell["tpf"] for cell in one["speed"]["held"].values()]


def _args(tmp_path, *extra):
    prompts = tmp_path / "held.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    return ["--model", "tiny", "--prompts", str(prompts), "--methods", "ar", "--max-new-tokens", "4", "--out",
            str(tmp_path / "eval"), *extra]


def test_a_report_or_parts_of_another_process_count_are_refused_before_a_model_loads(tmp_path, monkeypatch, capsys):
    import jf_jax.api
    from jf_jax.cli.evaluate import main, parser
    from jf_jax.cli.evaluate_options import run_settings
    from jf_jax.eval.report import device_name

    def unloadable(spec, *args, **kwargs):  # reached only once the report and its parts were accepted
        raise ValueError("not loaded in this test")

    monkeypatch.setattr(jf_jax.api, "load_model", unloadable)
    part = tmp_path / "eval.process-001-of-003.json"
    part.write_text(json.dumps(dict(args={}, results=[])))
    assert main(_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "has the parts of a 3-process run" in err and "this run has 1" in err
    part.unlink()

    run = run_settings(parser().parse_args(_args(tmp_path)), device=device_name(), processes=2)
    assert "coordinator" not in run and "process_id" not in run  # how the processes joined is no setting
    report = tmp_path / "eval.json"
    report.write_text(json.dumps(dict(args=run, results=[dict(model="other")])))
    assert main(_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "processes: 2 there, 1 here" in err
    del run["processes"]  # a report written before the count was recorded: one process's, so it resumes
    report.write_text(json.dumps(dict(args=run, results=[dict(model="other")])))
    assert main(_args(tmp_path)) == 2
    assert "--model tiny cannot be loaded: not loaded in this test" in capsys.readouterr().err


@pytest.mark.slow  # seven JAX processes start and compile the decoders (~1.5 min)
def test_two_processes_evaluate_what_one_process_evaluates(tmp_path, tiny_gguf):
    prompts, math = tmp_path / "held.jsonl", tmp_path / "gsm.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {word}."}) + "\n"
                               for i, word in enumerate(["one", "two", "three", "four", "five"])))
    math.write_text("".join(json.dumps({"id": f"m{i}", "prompt": f"{i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    evaluate = [sys.executable, "-m", "jf_jax.evaluate", "--model", str(tiny_gguf), "--prompts", str(prompts),
                "--math", str(math), "--math-batch", "2", "--math-max-new-tokens", "4", "--methods", "ar,jacobi",
                "--block-size", "4", "--max-new-tokens", "8"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}

    def pair(out, *extra, env=env):
        results = run_pair(jf_jax_pair(evaluate + ["--out", str(out), *extra]), cwd=ROOT, env=env, timeout=300)
        for i, (code, stdout, stderr) in enumerate(results):
            assert code == 0, f"process {i}: " + stdout + stderr[-3000:] + f"\nthe other: {results[1 - i][2][-2000:]}"
        return results

    one = subprocess.run(evaluate + ["--out", str(tmp_path / "one")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert one.returncode == 0, one.stdout + one.stderr[-3000:]
    pair(tmp_path / "two")
    single, merged = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("one", "two"))
    assert single["args"]["processes"] == 1 and merged["args"]["processes"] == 2
    (res_one,), (res_two,) = single["results"], merged["results"]
    for method in ("ar", "jacobi n=4"):
        a, b = res_one["speed"]["held"][method], res_two["speed"]["held"][method]
        assert b["prompts"] == 5 and b["token_ids"] == a["token_ids"] and b["match_ar"] == a["match_ar"] == 1.0
        assert [p["tpf"] for p in b["per_prompt"]] == [p["tpf"] for p in a["per_prompt"]]
        assert (b["tpf"], b["mean_tpf"], b["mean_tpf_ci95"]) == (a["tpf"], a["mean_tpf"], a["mean_tpf_ci95"])
    assert _unclocked(res_two) == _unclocked(res_one)  # the GSM answers too, in order
    assert "Decoded by 2 processes" in (tmp_path / "two.md").read_text()
    parts = sorted(p for p in os.listdir(tmp_path) if p.startswith("two.process-"))
    assert parts == ["two.process-000-of-002.json", "two.process-001-of-002.json"]

    # Resume per process: process 1's share was lost, process 0's is kept; only process 1 decodes again.
    (tmp_path / "two.json").unlink()
    (tmp_path / "two.process-001-of-002.json").unlink()
    (_, out0, _), (_, out1, _) = pair(tmp_path / "two")
    assert "this process's share is already in" in out0 and "this process's share is already in" not in out1
    assert _unclocked(json.loads((tmp_path / "two.json").read_text())["results"]) == _unclocked([res_one])

    # Each process on a mesh of its own two devices (its share's rows over data): the same answers.
    pair(tmp_path / "meshed", "--mesh", "data=2", env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    meshed = json.loads((tmp_path / "meshed.json").read_text())
    assert meshed["args"]["mesh"] == "data=2,fsdp=1,tensor=1" and meshed["args"]["processes"] == 2
    assert _unclocked(meshed["results"]) == _unclocked([res_one])
