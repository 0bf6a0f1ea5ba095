"""Multi-process training on JAX's own runtime: two localhost processes (``jax.distributed``, gloo collectives,
4 simulated CPU devices each) run the train step over one global 8-device mesh and get the single-device step."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # two JAX processes compile the step (~1 min)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.multiprocess_step_check", str(port), str(i)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            outputs.append((p.returncode, out, err))
    finally:
        for p in procs:
            p.kill()
    for code, out, err in outputs:
        assert code == 0, out + err[-3000:]
    report = json.loads(outputs[0][1].strip().splitlines()[-1])
    assert (report["process_count"], report["global_devices"], report["local_devices"]) == (2, 8, 4)
    assert report["mesh"] == {"data": 2, "fsdp": 4} and report["mesh_processes"] == [0, 1]
    assert report["params_sharded"]
    # as tests/test_train.py's 8-device check: float rounding only (a lost shard or reduction moves params by ~lr)
    assert report["max_param_diff"] < 1e-4, report
    for key, value in report["metrics_diff"].items():
        assert value < 1e-5, (key, value)
