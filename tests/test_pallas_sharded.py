"""The Pallas attention kernels on (data, fsdp, tensor) meshes: each device runs them on its own rows and heads
(``model.sharding.attention_per_device``), so the sharded training loss and gradients equal one device's and no
collective surrounds the kernel. Also the attention-only fallbacks of ``attention_per_device`` in one process.

The mesh checks run in a subprocess with 8 simulated CPU devices (``tests.support.sharded_attention_check``), the
kernels in Pallas interpret mode (Triton's and the TPU's). A kernel is a custom call XLA cannot partition: called
without the wrapper, the same program gathers q, k and v whole on every device (Triton interpret), or puts the
call on one device (TPU interpret's host callbacks), and the compiled TPU kernel refuses to lower at all.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jf_jax.model.sharding import attention_per_device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_check(part: str) -> dict:
    # ALLOW_MULTIPLE_LIBTPU_LOAD: where libtpu is installed, this process may hold its lock file already.
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.support.sharded_attention_check", part], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8
    return report


@pytest.fixture(scope="module")
def report():
    return run_check("kernels")


def kernels(report):
    """(name, record) of each kernel's runs (not the plain-JAX attention's, there for comparison)."""
    return [(name, r) for name, r in report["meshes"].items() if not name.startswith("reference")]


@pytest.mark.slow  # a subprocess that compiles both interpreted kernels' loss and gradient on two meshes
def test_sharded_training_loss_and_gradients_equal_one_devices(report):
    from tests.support.sharded_attention_check import IMPLS, TRAINING_MESHES

    names = {f"{impl} {'x'.join(map(str, shape))}" for impl in (*IMPLS, "reference", "reference-remat")
             for shape in TRAINING_MESHES}
    assert set(report["meshes"]) == names
    for name, r in kernels(report):
        # The tensor split sums wo's and the head's partial products across devices: float32 rounding, no more.
        assert r["loss"] == pytest.approx(r["loss_one_device"], rel=1e-6), (name, r["loss"], r["loss_one_device"])
        assert r["max_grad_diff"] <= 1e-5 * r["max_grad"], (name, r["max_grad_diff"], r["max_grad"])
        # The attention alone: each device computes its heads as one device computes them.
        value, one_value = r["attention_value"]
        assert value == pytest.approx(one_value, rel=1e-6), (name, value, one_value)
        assert r["attention_max_grad_diff"] <= 1e-6 * r["attention_max_grad"], (name, r["attention_max_grad_diff"])


@pytest.mark.slow
def test_no_collective_surrounds_the_kernel(report):
    for name, r in kernels(report):
        # Forward and gradients of the attention: only the loss's own sum is reduced; nothing is gathered.
        assert r["attention_program"]["all-gather"] == 0, (name, r["attention_program"])
        # The kernel called as it is: q, k and v gathered whole around it.
        assert r["unwrapped_attention_program"]["all-gather"] > 0, (name, r["unwrapped_attention_program"])
        # The whole loss gathers what it gathers with the plain-JAX attention, which XLA partitions by heads
        # itself: the fsdp-split weights, and the embedding rows of the lookup.
        reference = report["meshes"][f"reference{'-remat' * r['remat']} {name.split()[1]}"]["loss_program"]
        assert r["loss_program"]["all_gather_shapes"] == reference["all_gather_shapes"], (name, r, reference)


@pytest.mark.slow
def test_the_compiled_tpu_kernel_sees_its_devices_rows_and_heads(report):
    tpu = report["tpu"]
    # 2x2x2: 8 rows over data x fsdp, 4 query and 2 KV heads over tensor: each call takes [2, 2, T, D] queries and
    # [2, 1, S, D] keys and values (the TPU layout [B, H, T, D]). Forward, dq and dk/dv.
    assert len(tpu["export_operands"]) == 3
    for operands in tpu["export_operands"]:
        assert "tensor<2x2x32x8xf32>, tensor<2x1x32x8xf32>, tensor<2x1x32x8xf32>" in operands, operands
    assert "cannot be automatically partitioned" in tpu["unwrapped_export"], tpu["unwrapped_export"]
    if "tpu_compile" not in tpu:
        pytest.skip("libtpu is not installed (pip install 'libtpu==0.0.42.*', jax 0.10.2's): no TPU compiler")
    compiled = tpu["tpu_compile"]
    assert compiled["all-gather"] == 0 and compiled["all-to-all"] == 0, compiled
    assert len(compiled["kernel_shapes"]) == 3
    assert all("bf16[2,2,256,128]" in s or "bf16[2,1,256,128]" in s for s in compiled["kernel_shapes"]), compiled


def test_outside_a_mesh_the_kernel_is_called_as_it_is():
    calls = []

    def kernel(q, k, v, q_meta, k_meta):
        calls.append(q.shape)
        return q

    q = jnp.zeros((2, 4, 4, 8))
    assert attention_per_device(kernel, q, q[:, :, :2], q[:, :, :2], (), ()) is q
    assert calls == [(2, 4, 4, 8)]


def test_on_a_one_device_mesh_the_kernel_is_called_as_it_is():
    from jf_jax.model.sharding import make_mesh

    mesh = make_mesh(1, 1, jax.devices()[:1], tensor=1)
    q = np.zeros((2, 4, 4, 8), np.float32)
    with jax.set_mesh(mesh):
        out = jax.jit(lambda q: attention_per_device(lambda q, *_: q * 2, q, q[:, :, :2], q[:, :, :2], (), ()))(q)
        text = jax.jit(lambda q: attention_per_device(lambda q, *_: q * 2, q, q, q, (), ())).lower(q).as_text()
    assert np.array_equal(np.asarray(out), q * 2) and "manual_computation" not in text
