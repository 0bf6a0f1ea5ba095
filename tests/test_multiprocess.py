"""Multi-process training on JAX's own runtime: two localhost processes (``jax.distributed``, gloo collectives,
4 simulated CPU devices each) run the train step over one global 8-device mesh and get the single-device step."""

import json
import os
import subprocess
import sys

import pytest

from tests.support.processes import jf_jax_pair, run_pair

pytestmark = pytest.mark.slow  # two JAX processes compile the step (~1 min)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_two_processes_train_like_one_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    outputs = run_pair(lambda port, i: [sys.executable, "-m", "tests.support.multiprocess_step_check", str(port),
                                        str(i)], cwd=ROOT, env=env, timeout=600)
    for code, out, err in outputs:
        assert code == 0, out + err[-3000:]
    report = json.loads(outputs[0][1].strip().splitlines()[-1])
    assert (report["process_count"], report["global_devices"], report["local_devices"]) == (2, 8, 4)
    assert report["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1} and report["mesh_processes"] == [0, 1]
    assert report["params_sharded"]
    # as tests/test_train.py's 8-device check: float rounding only (a lost shard or reduction moves params by ~lr)
    assert report["max_param_diff"] < 1e-4, report
    for key, value in report["metrics_diff"].items():
        assert value < 1e-5, (key, value)


def test_a_two_process_training_run_matches_a_one_process_run(tmp_path):
    """``python -m jf_jax.train`` with --coordinator on two processes x 4 devices against one process x 8 devices, same
    config and mesh: process 0 writes the run directory, both write the orbax checkpoints, and the trained
    parameters and logged losses agree to float rounding."""
    import numpy as np

    from jf_jax.weights.run_dir import load_run, read_metrics

    overrides = ["mesh.data=2", "mesh.fsdp=4", "data.batch_size=8", "train.steps=6", "train.ckpt_every=3"]
    base = {**os.environ, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    train = [sys.executable, "-m", "jf_jax.train", "configs/tiny.yaml", *overrides, "--no-progress"]
    single = subprocess.run(train + ["--run-dir", str(tmp_path / "one")], cwd=ROOT, capture_output=True, text=True,
                            env={**base, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, timeout=600)
    assert single.returncode == 0, single.stdout + single.stderr[-3000:]
    env = {**base, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    for code, out, err in run_pair(jf_jax_pair(train + ["--run-dir", str(tmp_path / "two")]), cwd=ROOT, env=env,
                                   timeout=600):
        assert code == 0, out + err[-3000:]
    (_, one), (_, two) = load_run(str(tmp_path / "one")), load_run(str(tmp_path / "two"))
    for a, b in zip(jax_leaves(one), jax_leaves(two)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    m1, m2 = read_metrics(str(tmp_path / "one")), read_metrics(str(tmp_path / "two"))
    assert [r["step"] for r in m1] == [r["step"] for r in m2] == list(range(1, 7))  # written once, by process 0
    np.testing.assert_allclose([r["loss/total"] for r in m1], [r["loss/total"] for r in m2], rtol=1e-5)


def jax_leaves(tree):
    import jax
    import numpy as np

    return [np.asarray(x) for x in jax.tree.leaves(tree)]
