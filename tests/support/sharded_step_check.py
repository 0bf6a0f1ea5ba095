"""Runs two train steps on 1 device and on (data, fsdp, tensor) meshes of 8 simulated CPU devices.

Started by tests/test_train.py in a subprocess (``python -m tests.support.sharded_step_check``) with
XLA_FLAGS=--xla_force_host_platform_device_count=8; prints a JSON report on its last stdout line. The 2x4x1 mesh
runs with grad_accum=2, the single-device one without, so the comparison also covers gradient accumulation; the
meshes with a tensor axis split the tiny model's 4 query and 2 KV heads, its MLP and its vocabulary in two.
"""

import dataclasses
import json

import jax
import numpy as np

from jf_jax.training.losses import LossConfig
from jf_jax.model.sharding import ShardingRules, make_mesh
from jf_jax.training.state import OptimConfig, init_state, make_optimizer, state_shardings
from jf_jax.training.step import make_train_step, put_batch
from tests.support.train_models import TINY, numpy_params, synthetic_batch


def batch():
    return synthetic_batch(TINY.vocab_size, 8, 32)


def run(mesh, ocfg, host_batch):
    rules, lcfg, steps = ShardingRules(), LossConfig(), 10
    optimizer = make_optimizer(TINY, ocfg, steps)
    params = numpy_params(TINY, seed=0)
    shardings = state_shardings(TINY, optimizer, params, mesh, rules)
    state = jax.device_put(init_state(params, optimizer), shardings)
    step = make_train_step(TINY, lcfg, ocfg, steps, mesh, rules, shardings)
    for _ in range(2):  # two steps so Adam's moments (sharded like the params) are exercised too
        state, metrics = step(state, put_batch(host_batch, mesh, rules))
    return state, {k: float(v) for k, v in metrics.items()}, shardings


def main():
    host_batch = batch()
    ocfg = OptimConfig(learning_rate=1e-2, warmup_steps=0, clip_norm=1.0, weight_decay=0.1)
    single_state, single_metrics, _ = run(make_mesh(1, 1, jax.devices()[:1]), ocfg, host_batch)
    ref = jax.device_get(single_state.params)
    report = {"devices": jax.device_count(), "meshes": {}}
    for shape, accum in (((2, 4, 1), 2), ((2, 2, 2), 1), ((1, 4, 2), 1), ((4, 1, 2), 2)):
        mesh = make_mesh(*shape[:2], tensor=shape[2])
        state, metrics, shardings = run(mesh, dataclasses.replace(ocfg, grad_accum=accum), host_batch)
        diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))), jax.device_get(state.params), ref)
        specs = {name: str(shardings.params["layers"][name].spec) for name in ("wq", "wk", "w_down")}
        report["meshes"]["x".join(map(str, shape))] = {
            "mesh": dict(mesh.shape), "grad_accum": accum, "max_param_diff": max(jax.tree.leaves(diffs)),
            "metrics_diff": {k: abs(metrics[k] - single_metrics[k]) / max(1.0, abs(single_metrics[k]))
                             for k in single_metrics},
            "specs": specs, "lm_head_spec": str(shardings.params["lm_head"].spec)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
