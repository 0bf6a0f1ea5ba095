"""``jf-jax plan``: the HLO counts it rests on, its refusals, and (slow) plans on 8 simulated devices checked
against a real run of the planned train step."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jf_jax.cli import plan as plan_cli
from jf_jax.model.config import PUBLISHED_SHAPES, from_hf_config
from jf_jax.tuning import plan, roofline
from jf_jax.tuning.hlo_stats import hlo_stats, shape_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_hlo_counts_a_loop_as_it_runs():
    """XLA's cost analysis counts a scan's body once; the HLO count multiplies it by the trip count."""
    def layers(w, x):
        return jax.lax.scan(lambda x, wi: (jnp.tanh(x @ wi), None), x, w)[0]

    compiled = jax.jit(layers).lower(jax.ShapeDtypeStruct((6, 64, 64), jnp.float32),
                                     jax.ShapeDtypeStruct((16, 64), jnp.float32)).compile()
    stats = hlo_stats(compiled.as_text())
    assert stats.loops == (6,)
    assert stats.dot_flops == 6 * 2 * 16 * 64 * 64
    assert stats.total_collective_bytes == 0
    assert stats.op_bytes > 6 * 64 * 64 * 4  # at least every layer's weights read once


def test_collectives_are_counted_by_their_buffers():
    text = """HloModule m

%body (p: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %p = (s32[], f32[8,4]{1,0}) parameter(0)
  %x = f32[2,4]{1,0} get-tuple-element(%p), index=1
  %g = f32[8,4]{1,0} all-gather(%x), dimensions={0}
  %r = f32[8,4]{1,0} all-reduce(%g), to_apply=%add
  ROOT %t = (s32[], f32[8,4]{1,0}) tuple(%i, %r)
}

ENTRY %main (a: f32[8,4]) -> f32[2,4] {
  %a = f32[8,4]{1,0} parameter(0)
  %w = (s32[], f32[8,4]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %s = f32[2,4]{1,0} reduce-scatter(%a), dimensions={0}, to_apply=%add
}
"""
    stats = hlo_stats(text)
    assert shape_bytes("(f32[8,4]{1,0}, s32[])") == 132
    assert stats.collective_ops == {"all-reduce": 3, "all-gather": 3, "reduce-scatter": 1, "all-to-all": 0,
                                    "collective-permute": 0}
    # all-gather: its gathered result; reduce-scatter: its whole operand; both inside the loop 3 times
    assert stats.collective_bytes["all-gather"] == 3 * 128 and stats.collective_bytes["all-reduce"] == 3 * 128
    assert stats.collective_bytes["reduce-scatter"] == 128


def test_targets_carry_capacity_bandwidth_peak_and_a_source():
    assert {"v5e", "v5p", "v6e", "a100-80gb", "h100", "h200", "b200"} <= set(roofline.TARGETS)
    for name, dev in roofline.TARGETS.items():
        assert dev.hbm_bytes > 0 and dev.bandwidth > 0 and dev.peak_flops > 0 and dev.link_bandwidth > 0, name
        assert dev.source, name
    assert roofline.TARGETS["h200"] is roofline.GPUS["H200"]  # one table: the tuner's GPUs are the plan's


def test_published_shapes_have_their_parameter_counts():
    from jf_jax.model.params import abstract_params, count_params

    counts = {k: count_params(abstract_params(from_hf_config(v))) / 1e9 for k, v in PUBLISHED_SHAPES.items()}
    assert counts["qwen2.5-7b"] == counts["qwen2.5-coder-7b"] == pytest.approx(7.62, abs=0.01)
    assert counts["qwen3-8b"] == pytest.approx(8.19, abs=0.01)
    assert counts["llama-3.1-8b"] == pytest.approx(8.03, abs=0.01)
    assert counts["qwen2.5-0.5b"] == pytest.approx(0.494, abs=0.001)


@pytest.mark.parametrize("argv, expected", [
    (["--mesh", "fsdp=4,tensor=8"], "query heads 28 and KV heads 4 do not divide the tensor axis of 8"),
    (["--mesh", "fsdp=0"], "mesh axes must be positive integers"),
    (["--mesh", "fsdp=3", "--batch", "8"], "does not split over the mesh's 3 data x fsdp devices"),
    (["--mesh", "fsdp=8"], "XLA_FLAGS=--xla_force_host_platform_device_count=8"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
])
def test_a_bad_request_is_one_line_before_anything_compiles(capsys, argv, expected):
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err


def test_a_bad_mesh_string_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        plan_cli.main(["--mesh", "fsdp8"])
    assert "--mesh takes data=N, fsdp=N, tensor=N" in capsys.readouterr().err


def test_teacher_tokens_default_to_the_prompt_and_the_clean_half():
    assert plan.TrainShape(seq_len=2048, prompt_len=256).teacher_tokens == 1152
    assert plan.TrainShape(seq_len=1024, teacher_len=1024).teacher_tokens == 1024


@pytest.mark.slow  # a subprocess that compiles train and decode programs on 8 simulated devices (~1-2 min)
def test_plans_on_8_devices_and_the_train_step_memory_of_a_real_run(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile every program here: the plan reads the executables
    proc = subprocess.run([sys.executable, "-m", "tests.support.plan_check", str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8
    for mesh, r in report["plans"].items():
        assert r["code"] == 0, (mesh, r["stderr"])
        p = r["plan"]
        for part in ("train", "decode"):
            per_device = p[part]["per_device"]
            assert per_device and all("bytes" in k for k in per_device), (mesh, part, per_device)
            assert per_device["peak_bytes"] > 0 and p[part]["verdict"] == "fits"
        assert p["train"]["per_device"]["params_bytes"] > 0 and p["decode"]["per_device"]["kv_cache_bytes"] > 0
        assert p["train"]["collectives"]["total_collective_bytes"] > 0  # 8 devices must talk
        assert 0.5 < p["train"]["flops_ratio_to_analytic"] < 1.5, p["train"]["flops_ratio_to_analytic"]
        assert "fits" in r["text"] and "collectives per step per device" in r["text"]
    # fsdp=8 holds an eighth of the state, fsdp=4 x tensor=2 too; each device's parameters are 4 B of its share
    n = report["plans"]["fsdp=8"]["plan"]["parameters"]
    for mesh in report["plans"]:
        assert report["plans"][mesh]["plan"]["train"]["per_device"]["params_bytes"] == pytest.approx(4 * n / 8,
                                                                                                      rel=0.05)
    big = report["too_big"]
    assert big["code"] == 1 and "does not fit: train: needs" in big["stderr"] and "16 GiB of HBM" in big["stderr"]
    # The check the plan exists for: its train-step memory per device against a real run of the same step on the
    # same 8 devices (tests/support/plan_check.py). Compared: (1) each part of the step's inputs against the bytes
    # of device 0's shards of the arrays the run placed; (2) the plan's peak against those bytes + the temporaries
    # and non-aliased outputs of the executable compiled for the real arrays; (3) the plan's peak against those
    # bytes + the rise of the process's resident memory per device during a step (the CPU backend reports no device
    # memory statistics, and every simulated device's buffers live in the one process).
    planned, real = report["planned"], report["real"]
    assert real["loss"] == real["loss"]  # the step ran (not NaN)
    for part in ("params", "optimizer", "reference", "batch"):
        assert abs(planned["parts"][part] - real["inputs"][part]) <= 0.15 * real["inputs"][part], (part, report)
    assert abs(planned["peak_bytes"] - real["executable_total"]) <= 0.01 * real["executable_total"], (planned, real)
    # The resident rise: what the step really allocated. The plan and the real step are compiled alike
    # (``plan.compiler_options``: without YNNPACK's multi-op fusions, whose intermediates YNNPACK allocates outside
    # XLA's buffer assignment), so nothing is left outside the plan but the sampler's noise.
    resident = real["resident_total"]
    assert abs(planned["peak_bytes"] - resident) <= 0.03 * resident, (planned, real)
    assert all(report["placement"].values()), report["placement"]


def test_the_planned_decode_step_is_built_for_the_accelerator_by_argument():
    """The planner names its target platform to the model: built for it on this CPU, the decode step has no
    ``cpu_kernels`` custom call and the accelerators' dot rows, while the same step built for this machine keeps
    this machine's choices, in the same process (nothing is swapped and restored)."""
    import cpu_kernels
    from jf_jax.model.transformer import decode_dot_rows
    from jf_jax.model.weight_matmul import DotRows, this_machine_dot_rows
    from tests.support.decoding_models import CFG

    mesh = plan.build_mesh(plan.MeshShape())
    model, view, ids, cache = plan.decode_inputs(CFG, plan.DecodeShape(batch=1, context=60, block_size=4), 4, mesh)

    def program(platform):
        return jax.jit(plan.decode_step(model, platform)).lower(view, ids, cache).as_text()

    assert "@jf_" not in program(plan.ACCELERATOR)
    if jax.default_backend() == "cpu" and cpu_kernels.cache_write_available():
        assert "@jf_cache_write" in program("cpu")
    assert decode_dot_rows("bfloat16", plan.ACCELERATOR) == DotRows(2, None)
    assert decode_dot_rows("bfloat16", jax.default_backend()) == this_machine_dot_rows("bfloat16")
