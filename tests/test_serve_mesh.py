"""``jf-jax serve --mesh``: a server decoding on several (simulated CPU) devices, weights and KV cache heads split over
``tensor`` and each batch's rows over ``data``, answers every request with the tokens ``api.generate`` gives its
prompt alone on one device with AR, for every served method, and compiles nothing after warm-up. A mesh the devices
or the model cannot take is refused in one line before anything is served."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from tests.support.serve_server import serve_in_subprocess
from tests.test_serve import CASES, CONTEXT, ask, finish, model, solo, staggered, wait_idle  # noqa: F401 (fixture)

DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


@pytest.mark.slow  # a server subprocess that compiles three methods' programs on a 2 x 2 mesh
def test_a_server_on_a_data_by_tensor_mesh_gives_solo_ar_tokens(tiny_gguf, model):  # noqa: F811 (fixture)
    # The tiny model's 4 query and 2 KV heads: each tensor device holds 2 and 1; 2 slots per row device.
    args = ("--model", str(tiny_gguf), "--mesh", "data=2,tensor=2", "--max-batch", "4", "--method", "jacobi",
            "--block-size", "3", "--methods", "ar,mr", "--max-context", str(CONTEXT), "--dtype", "float32",
            "--sampling", "0.8:0.9", "--max-sampling", "2", "--log-level", "warning")
    methods = itertools.cycle(["jacobi", "ar", "mr"])
    cases = [(*case, {"method": next(methods)}) for case in CASES]
    with serve_in_subprocess(*args, env=DEVICES) as client:
        assert client.metric("devices") == 4
        results = staggered(client, cases, timeout=300)
        wait_idle(client, timeout=60)
        assert client.metric("compilations_after_warmup_total") == 0
    assert len(results) == len(cases)
    for i, (kind, prompt, max_tokens, sampling, seed, _, fields) in enumerate(cases):
        ids, text = solo(model, kind, prompt, max_tokens, sampling, seed or 0)
        assert results[i] == (text, ids, finish(model, ids)), (fields, cases[i])


@pytest.mark.parametrize("mesh, batch, named", [
    ("tensor=8", "4", "4 device(s)"),  # more than the 4 simulated devices
    ("data=2,tensor=2", "3", "--max-batch 3"),  # rows that do not split over data
    ("tensor=4", "4", "KV heads 2"),  # the tiny model's KV heads do not split 4 ways
])
def test_a_mesh_that_cannot_serve_is_refused_in_one_line(tiny_gguf, mesh, batch, named):
    proc = subprocess.run([sys.executable, "-m", "jf_jax.serve", "--model", str(tiny_gguf), "--mesh", mesh,
                           "--max-batch", batch, "--port", "1"], env={**os.environ, **DEVICES},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]
