"""The GPU benchmarks, run on the CPU as their user runs them, at tiny sizes: a lent GPU gets one shot, so their
whole path (every section, the JSON, the closing table) must already have run somewhere.

``python -m jf_jax.benchmarks.gpu_decode --config tiny`` (bandwidth, bytes per step, AR and Jacobi with and
without a fixed decode shape), ``python -m jf_jax.benchmarks.attention --dry-run --backward`` (sparsity, and the
forward + backward variants once in interpret mode at a tiny shape) and the 7B parts (``jf_jax.benchmarks.gpu_7b``)
at a 2-layer model. Each takes 10-30 s on two cores: slow lane.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(benchmark: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m jf_jax.benchmarks.BENCHMARK ARGS`` (what the experiments/ scripts of the same name call)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", f"jf_jax.benchmarks.{benchmark}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_decode_bench_runs_every_section_at_a_tiny_size(tmp_path):
    from jf_jax.model.params import abstract_params, count_params

    out = tmp_path / "decode.json"
    proc = _run("gpu_decode", "--config", "tiny", "--tokens", "8", "--repeats", "2", "--bandwidth-mib", "8",
                "--decode-shapes", "none,1x16", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "errors" not in report, report["errors"]
    env = report["environment"]
    assert env["backend"] == "cpu" and env["devices"] and "xla_flags" in env and env["jax"]
    assert report["bandwidth"]["bytes_per_second"] > 0
    # Every weight once (the tied embedding as the output head), plus at most one embedding row for the lookup.
    cfg = report["config"]
    from jf_jax.model.config import ModelConfig

    params_bytes = 2 * count_params(abstract_params(ModelConfig.from_dict(cfg)))  # bfloat16
    assert params_bytes <= report["step_bytes"]["weight_bytes"] <= params_bytes + 2 * cfg["hidden_size"]
    assert report["ar_bound_tokens_per_second"] > 0
    none = report["entries"]["none"]
    for method in ("ar", "jacobi"):
        r = none[method]
        assert r["tokens"] == [8, 8], r  # EOS disabled: every prompt runs to --tokens
        assert r["tokens_per_second"] > 0 and r["ms_per_forward"] > 0 and r["fraction_of_bound"] > 0
    fixed = report["entries"]["1x16"]
    # jf_jax.decoding.shapes may not exist in every checkout: then the entry says so and the run goes on.
    assert "unavailable" in fixed or fixed["ar"]["tokens"] == fixed["jacobi"]["tokens"] == [8, 8], fixed
    tail = proc.stdout.strip().splitlines()
    assert tail[-3].strip().startswith("entry") and tail[-2].split()[0] == "none" and tail[-1].split()[0] == "1x16"


@pytest.mark.slow
def test_attention_bench_dry_run_exercises_the_backward_path(tmp_path):
    out = tmp_path / "attention.json"
    proc = _run("attention", "--dry-run", "--backward", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mask density" in proc.stdout and "Traceback" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["timed"] is False and report["tokens"] == 768  # the paper's packing: 256 + 16 x 16 x 2
    assert [row["tiles"] for row in report["tiles"]] == ["64x64", "64x128", "128x64", "128x128"]
    assert all(0 < row["skipped"] < 1 for row in report["tiles"])
    rows = {row["variant"]: row for row in report["backward_smoke"]["rows"]}
    assert sorted(rows) == ["dense reference", "kernel, fused backward", "kernel, reference VJP"]
    for row in rows.values():
        assert "error" not in row, row
        assert row["ms"] > 0 and row["memory"]["temp_size_in_bytes"] > 0
    assert rows["kernel, fused backward"]["max_rel_err"] < 1e-4  # float32, interpret mode
    assert proc.stdout.strip().splitlines()[-1].lstrip().startswith("fwd+bwd")  # the summary comes last


@pytest.mark.slow
def test_gpu_7b_script_runs_every_section_at_a_tiny_size(tmp_path):
    """The 7B bench's decode and train parts at a 2-layer model: every section has a result, the padded
    decoders equal AR, and the train step's ahead-of-time memory analysis counts at least its state."""
    proc = _run("gpu_7b", "decode", "--config", "tiny", "--out", str(tmp_path), "--bandwidth-mib", "8",
                "--context", "24", "--tokens", "12", "--sizes", "1,4,8", "--block-size", "4", "--latency-repeats", "2",
                "--repeats", "2", "--ar-batch", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    decode = json.loads((tmp_path / "decode.json").read_text())["sections"]
    assert all("result" in record for record in decode.values()), decode
    assert decode["latency"]["result"]["tokens"] == [1, 4, 8]
    assert decode["ar_batch1"]["result"]["tokens"] == 2 * 12 and decode["ar_batch1"]["result"]["fraction_of_bound"] > 0
    runs = decode["lossless_fixed_shape"]["result"]["runs"]
    assert decode["lossless_fixed_shape"]["result"]["decode_shape"] == "4x8"  # mr (4, 2, 4) covers the others
    assert runs["jacobi"]["equal_to_ar"] == runs["mr"]["equal_to_ar"] == [True, True]

    proc = _run("gpu_7b", "train", "--config", "tiny", "--out", str(tmp_path), "--row-len", "96", "--prompt-len",
                "16", "--train-blocks", "4", "--train-block", "8", "--steps", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = json.loads((tmp_path / "train.json").read_text())["sections"]
    recipe = train["recipe"]["result"]  # the CPU reports no memory limit, so the first candidate runs
    memory = recipe["memory_analysis"]
    assert memory["arguments"] >= recipe["state_bytes"] + recipe["reference_bytes"] > recipe["state_bytes"] > 0
    assert len(recipe["losses"]) == 2 and all(x == x and x > 0 for x in recipe["losses"])
    assert list(train) == ["environment", "recipe"]  # it stops at the first candidate that ran
