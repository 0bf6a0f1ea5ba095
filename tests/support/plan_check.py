"""``jf-jax plan`` on 8 simulated CPU devices, and the plan's train-step memory against a real run of that step.

Started by tests/test_plan.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 and a
directory argument; prints a JSON report on its last stdout line:

* ``plans``: the plan of a small model (``SMALL_HF``, written as a config.json) for meshes fsdp=8 and
  fsdp=4,tensor=2 (exit status, the JSON it wrote);
* ``too_big``: a 2.7 B-parameter shape on one TPU v5e (16 GiB) with its state unsharded (exit status, stderr);
* ``planned`` and ``real``: a medium model's (``MEDIUM_HF``, 26 M parameters) train step on fsdp=8, planned from
  abstract inputs, then run for real: the bytes of device 0's shards of the arrays the step takes (state, reference,
  batch), the temporaries and non-aliased outputs of the executable compiled for those arrays, and how far the
  process's resident memory rises per device while the step runs (the CPU backend keeps no memory statistics;
  every simulated device's buffers are this process's memory);
* ``placement``: ``decoding.placement.view_shardings`` (the plan compiles with it) against ``place_params``.
"""

import contextlib
import io
import json
import os
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np

from jf_jax.cli import plan as plan_cli
from jf_jax.decoding import placement
from jf_jax.decoding.placement import place_params
from jf_jax.model.config import from_hf_config
from jf_jax.model.decode_view import decode_view
from jf_jax.model.params import cast_params
from jf_jax.model.sharding import ShardingRules
from jf_jax.tuning import plan
from jf_jax.training.state import init_state, make_optimizer
from jf_jax.training.step import make_train_step, reference_params
from tests.support.train_models import numpy_params

SMALL_HF = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 512, "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 512, "hidden_act": "silu"}
BIG_HF = {**SMALL_HF, "vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 32768, "num_attention_heads": 64,
          "num_key_value_heads": 8}
MEDIUM_HF = {**SMALL_HF, "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
             "num_attention_heads": 8}
MEDIUM_TRAIN = plan.TrainShape(seq_len=512, batch=8, prompt_len=64)
TRAIN = ["--seq-len", "128", "--batch", "8", "--prompt-len", "32"]
DECODE = ["--decode-batch", "8", "--context", "64", "--block-size", "8"]


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = plan_cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def device0_bytes(tree) -> int:
    """Bytes of the shards of ``tree``'s arrays that live on device 0 (what that device holds of them)."""
    dev = jax.devices()[0]
    return int(sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == dev))


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rise(run, repeats: int = 4) -> int:
    """The largest rise of the process's resident memory over its level before a call, sampled every half a
    millisecond, over ``repeats`` calls of ``run`` (a call can reuse memory an earlier one left resident)."""
    best = 0
    for _ in range(repeats):
        base, peak, done = resident_bytes(), [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], resident_bytes())
                time.sleep(0.0005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        run()
        done.set()
        sampler.join()
        best = max(best, peak[0] - base)
    return best


def real_step(cfg, mesh_shape: plan.MeshShape, train: plan.TrainShape) -> dict:
    """The planned step run on real arrays: what device 0 holds of its inputs, the analysis of the executable
    compiled for them, and how much the process's resident memory rises per device while the step runs."""
    mesh = plan.build_mesh(mesh_shape)
    _, abstract, batch_like, ref_like = plan.train_inputs(cfg, train, mesh)
    model, loss, optim = plan.train_configs(cfg, train)
    shardings = jax.tree.map(lambda x: x.sharding, abstract)
    params = jax.device_put(numpy_params(model, seed=0), shardings.params)
    state = jax.device_put(init_state(params, make_optimizer(model, optim, 1000)), shardings)
    reference = jax.device_put(reference_params(params, model), jax.tree.map(lambda x: x.sharding, ref_like))
    del params
    rng = np.random.default_rng(0)
    batch = {k: jax.device_put(rng.integers(0, 2, x.shape).astype(x.dtype), x.sharding) for k, x in batch_like.items()}
    step = make_train_step(model, loss, optim, 1000, mesh, ShardingRules(), shardings, reference=reference)
    inputs = dict(params=device0_bytes(state.params), optimizer=device0_bytes((state.opt_state, state.step)),
                  reference=device0_bytes(reference), batch=device0_bytes(batch))
    # compiled as the plan compiles it (``plan.compiler_options``: no YNNPACK fusions, whose intermediates would be
    # resident memory outside the buffer assignment the plan reads)
    compiled = step.lower(state, batch, reference).compile(plan.compiler_options())
    m = compiled.memory_analysis()
    holder = {"state": state}

    def one_step():  # the state is donated: each step takes the last one's
        holder["state"], holder["metrics"] = compiled(holder["state"], batch, reference)
        jax.block_until_ready(holder["metrics"])

    one_step()
    rise = peak_rise(one_step) / mesh_shape.devices  # every device's buffers live in this one process
    extra = int(m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes)
    return dict(inputs=inputs, temp_bytes=int(m.temp_size_in_bytes), executable_total=sum(inputs.values()) + extra,
                resident_rise_per_device=rise, resident_total=sum(inputs.values()) + rise,
                loss=float(holder["metrics"]["loss/total"]))


def placement_specs(cfg) -> dict:
    model = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    view = decode_view(cast_params(numpy_params(model, seed=1), model.weight_dtype))
    out = {}
    for shape in (plan.MeshShape(fsdp=8), plan.MeshShape(fsdp=4, tensor=2), plan.MeshShape(data=8)):
        mesh = plan.build_mesh(shape)
        placed = jax.tree.map(lambda x: str(x.sharding.spec), place_params(mesh, view, model))
        planned = jax.tree.map(lambda s: str(s.spec), placement.view_shardings(mesh, view, model))
        out[str(shape)] = placed == planned
    return out


def main(tmp: Path):
    small, big = tmp / "small_config.json", tmp / "big_config.json"
    small.write_text(json.dumps(SMALL_HF))
    big.write_text(json.dumps(BIG_HF))
    report = {"devices": jax.device_count(), "plans": {}}
    for mesh in ("fsdp=8", "fsdp=4,tensor=2"):
        out = tmp / f"plan_{mesh.replace(',', '_').replace('=', '')}.json"
        code, text, err = run_cli(["--model", str(small), "--mesh", mesh, "--target", "v5e", *TRAIN, *DECODE,
                                   "--json", str(out)])
        report["plans"][mesh] = dict(code=code, text=text, stderr=err,
                                     plan=json.loads(out.read_text()) if out.exists() else None)
    code, text, err = run_cli(["--model", str(big), "--mesh", "fsdp=1", "--target", "v5e", "--seq-len", "64",
                               "--batch", "1", "--prompt-len", "16", "--skip-decode"])
    report["too_big"] = dict(code=code, stderr=err, text=text)
    medium, fsdp8 = from_hf_config(MEDIUM_HF), plan.MeshShape(fsdp=8)
    program = plan.compile_train(medium, fsdp8, MEDIUM_TRAIN)
    report["planned"] = dict(parts=program.parts, temp_bytes=program.temp_bytes, peak_bytes=program.peak_bytes)
    report["real"] = real_step(medium, fsdp8, MEDIUM_TRAIN)
    report["placement"] = placement_specs(from_hf_config(SMALL_HF))
    print(json.dumps(report))


def memory_by_length(lengths: list[int]) -> dict:
    """The medium model's plan against its real step (``real_step``) at each row length of ``lengths`` (8 rows,
    fsdp over every device of the process): how the gap between the plan and the resident rise changes as the
    step's own buffers grow. ``python -m tests.support.plan_check --lengths 512,1024,2048`` (a study, not a test),
    with XLA_FLAGS=--xla_force_host_platform_device_count=8 or 1."""
    medium, mesh, out = from_hf_config(MEDIUM_HF), plan.MeshShape(fsdp=jax.device_count()), {}
    for n in lengths:
        train = plan.TrainShape(seq_len=n, batch=8, prompt_len=64)
        program = plan.compile_train(medium, mesh, train)
        real = real_step(medium, mesh, train)
        out[n] = dict(plan_peak=program.peak_bytes, executable_total=real["executable_total"],
                      resident_total=real["resident_total"], gap_bytes=real["resident_total"] - program.peak_bytes,
                      under=round(1 - program.peak_bytes / real["resident_total"], 4))
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--lengths":
        print(json.dumps({"devices": jax.device_count(), "by_length": memory_by_length(
            [int(n) for n in sys.argv[2].split(",")])}))
    else:
        main(Path(sys.argv[1]))
