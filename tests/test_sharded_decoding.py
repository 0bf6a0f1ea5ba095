"""Decoding on a (data, fsdp, tensor) mesh of 8 simulated CPU devices (``decoding.placement``): rows split over
data x fsdp, heads, MLP units and vocabulary over tensor. jacobi and mr give the tokens of the same sharded
program's AR, greedy and sampled, and on the test model that AR equals one device's. A decode step never gathers the
KV cache, whether built for an accelerator (plain-JAX attention: no decoder runs a Pallas kernel) or for this CPU
(the CPU kernels' cache write and attention run on each device's rows and KV heads, ``sharding.per_device``)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # a subprocess that compiles three decoders on three meshes of 8 simulated devices
def test_sharded_decoding_equals_ar_and_one_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.support.sharded_decode_check"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8 and set(report["meshes"]) == {"1x1x2", "2x2x2", "4x1x2"}
    for name, r in report["meshes"].items():
        assert "tensor" in r["wq_spec"] and "tensor" in r["lm_head_spec"], (name, r)
        for mode in ("greedy", "sampled"):
            if mode in r:
                assert all(r[mode].values()), (name, mode, r[mode])
    assert "sampled" in report["meshes"]["4x1x2"]
    kernel = report["attention_kernel"]  # heads of 32: the CPU attention kernel on each device's rows and heads
    if kernel.pop("kernel_runs"):
        assert all(kernel.values()), kernel
    assert "KV heads 2 do not divide the tensor axis of 4" in report["tensor4"], report["tensor4"]


@pytest.mark.slow  # the embedded SmolLM2-135M decoded on one and on three simulated devices (~40 s)
def test_the_decode_cli_on_a_tensor_mesh_gives_one_devices_tokens(tmp_path):
    """SmolLM2-135M's 9 query and 3 KV heads split over ``--mesh tensor=3``: float32 jacobi and mr give the sharded
    AR's tokens, and that AR gives one device's (prompts written here, not in the repository; one device's jacobi
    and mr are held to its AR by tests/test_real_smollm2_decoding.py)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\nName three rivers in Europe.\n")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=3", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    reports = {}
    for name, extra in (("mesh", ["--mesh", "tensor=3", "--methods", "ar,jacobi,mr"]), ("one", ["--methods", "ar"])):
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([sys.executable, "-m", "jf_jax.decode", "--prompts", str(prompts), "--dtype", "float32",
                               "--max-new-tokens", "16", "--json", str(out), *extra],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        runs = json.loads(out.read_text())["runs"]
        reports[name] = {m: [r["token_ids"] for r in runs if r["method"] == m] for m in ("ar", "jacobi", "mr")}
    assert reports["mesh"]["ar"] == reports["one"]["ar"]
    assert reports["mesh"]["jacobi"] == reports["mesh"]["mr"] == reports["mesh"]["ar"]


@pytest.mark.slow  # a subprocess that compiles the planner's decode steps on three meshes of 8 simulated devices
def test_a_decode_step_never_gathers_the_kv_cache():
    """Every all-gather of a step together moves less than one layer's keys, in a step built for an accelerator and
    in one built for this CPU: the cache stays split by rows and KV heads and each device attends with its own
    heads; the cache write and decode attention (the CPU kernels' custom calls, which XLA cannot partition, or their
    plain-JAX twins, whose per-row gathers XLA would partition into collectives over the cache) run on each device's
    rows and KV heads, under the mesh the step is traced under (``sharding.per_device``). Split by rows alone, the
    accelerator's step exchanges nothing."""
    from tests.test_pallas_sharded import run_check

    report = run_check("decode")
    decode = report["decode"]
    layer = decode.pop("layer_cache_bytes")
    slot = layer // (4 * 1024)  # the test model's K x Dh of one slot, bf16 (4 rows x 1,024 slots a layer)
    assert {k.split()[1] for k in decode} == {"1x1x2", "2x1x2", "2x2x2", "4x1x1"}
    assert sum(k.startswith("cpu ") for k in decode) == 6  # each mesh with tensor, one token and four
    for name, r in decode.items():
        if not name.startswith(("cpu", "tpu")):  # the accelerator's step: attention and cache write per device
            # No cache slot moves between devices (one token's keys of one row and layer: K x Dh bf16). Before the
            # plain-JAX attention and write ran per device, XLA's partitioning of their per-row gathers and updates
            # permuted and all-reduced slices of the row-split cache.
            moved = r["collective_bytes"]["collective-permute"] + r["collective_bytes"]["all-to-all"]
            assert moved < slot, (name, r)
            if "x1 " in name:  # rows alone split: nothing to exchange at all
                assert sum(r["collective_bytes"].values()) == 0, (name, r)
        if name.startswith("cpu") and report["cpu_kernels"]:  # both kernels in the step, each call run per device
            assert {"jf_cache_write", "jf_decode_attention_avx2_bf16"} <= set(r["kernels"]), (name, r)
            assert r["per_device_calls"] == r["kernel_calls"], (name, r)
        # the accelerator's program and this CPU's on XLA:CPU's partitioner, and (with libtpu) the TPU compiler's
        assert r["all_gather_bytes"] < layer, (name, r, layer)
