"""A multi-process collection (``jf-jax collect --coordinator ...``): two localhost processes each take every other
prompt and write their own resumable part under one --out; the union of the parts is the one-process collection of
the same prompts, record for record (drafts are keyed by a prompt's index in the whole selection), and training
reads the parts unchanged."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.processes import jf_jax_pair, run_pair

pytestmark = pytest.mark.slow  # three JAX processes start and compile the recorder (~1 min)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records(out: str) -> dict:
    """Every record of every part under ``out``, keyed by (prompt tokens of block 0, block index)."""
    from jf_jax.training.trajectories import iter_records, trajectory_dirs

    by_example = {}
    for directory in trajectory_dirs(out):
        for rec in iter_records(directory):
            by_example.setdefault((directory, rec.example_id), []).append(rec)
    table = {}
    for recs in by_example.values():
        prompt = tuple(next(r for r in recs if r.block_index == 0).prompt_ids.tolist())
        for r in recs:
            table[(prompt, r.block_index)] = r.states
    return table


@pytest.mark.parametrize("mesh", [None, "data=2"], ids=["one-device-each", "mesh-of-each-process"])
def test_two_processes_collect_what_one_process_collects(tmp_path, tiny_gguf, mesh):
    """With --mesh, each process spreads its batched recorder over a mesh of its own two devices (rows over data)."""
    from jf_jax.training.trajectories import trajectory_dirs

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {word}."}) + "\n"
                               for i, word in enumerate(["one", "two", "three", "four", "five"])))
    collect = [sys.executable, "-m", "jf_jax.collect", "--model", str(tiny_gguf), "--prompts", str(prompts),
               "--block-size", "4", "--max-new-tokens", "8", "--prompts-per-shard", "2", "--no-progress"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    if mesh:
        collect += ["--mesh", mesh, "--batch-size", "2"]
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    one = subprocess.run(collect + ["--out", str(tmp_path / "one")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert one.returncode == 0, one.stdout + one.stderr[-3000:]
    results = run_pair(jf_jax_pair(collect + ["--out", str(tmp_path / "two")]), cwd=ROOT, env=env, timeout=240)
    for i, (code, out, err) in enumerate(results):
        assert code == 0, f"process {i}: " + out + err[-3000:] + f"\nthe other: {results[1 - i][2][-2000:]}"
    parts = trajectory_dirs(str(tmp_path / "two"))
    assert [os.path.basename(d) for d in parts] == ["process-000-of-002", "process-001-of-002"]
    single, union = _records(str(tmp_path / "one")), _records(str(tmp_path / "two"))
    assert single.keys() == union.keys() and len({prompt for prompt, _ in single}) == 5
    for key, states in single.items():
        np.testing.assert_array_equal(union[key], states)  # the drafts too, not only the fixed points
