"""A run checkpointed on one (data, fsdp, tensor) mesh resumes on others and continues the same loss curve.

Started by tests/test_reshard_resume.py in a subprocess (``python -m tests.support.reshard_resume_check``) with
XLA_FLAGS=--xla_force_host_platform_device_count=8; prints a JSON report on its last stdout line. The tiny config
(configs/tiny.yaml, 4 query and 2 KV heads: they split over tensor=2) trains 12 steps with batches of 8 rows and a
checkpoint every 3 steps:

* uninterrupted: steps 1-12 on mesh A (data=2, fsdp=4, tensor=1);
* resumed: steps 1-6 on mesh A (``stop_at_step=6``), then the same run dir with the config's mesh changed to B
  (data=1, fsdp=4, tensor=2) for steps 7-9, then to C (data=4, fsdp=1, tensor=2) for steps 10-12.

Each restore is observed (``CheckpointManager.restore`` wrapped): the report holds the mesh and the partition specs
of the restored arrays, the per-step metrics of both runs, the run's mesh history, its last config snapshot and the
largest difference of the two runs' final parameters. The run dirs go to a temporary directory that is removed.
"""

import json
import os
import sys
import tempfile

import jax
import numpy as np
import orbax.checkpoint as ocp

from jf_jax.training import loop as train_loop
from jf_jax.training.config import load_config
from jf_jax.training.loop import run_training
from jf_jax.weights import run_dir as rd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_YAML = os.path.join(ROOT, "configs", "tiny.yaml")
STEPS = 12
# 16 sequences in 2 batches of 8 rows per epoch: 8 rows split over every batch layout below (data x fsdp = 8, 4, 4).
SETTINGS = [f"train.steps={STEPS}", "train.ckpt_every=3", "train.keep_checkpoints=2", "data.synthetic.num_prompts=16",
            "data.batch_size=8", "optim.learning_rate=1e-2", "optim.warmup_steps=0"]
MESHES = {"A": (2, 4, 1), "B": (1, 4, 2), "C": (4, 1, 2)}
SEGMENTS = (("A", 6), ("B", 9), ("C", None))
"""The resumed run: (mesh, stop_at_step) of each run_training call on the same run dir."""

restored: list[dict] = []


def _observe_restores():
    """Records the mesh and the parameter specs of every restored checkpoint (what the loop trains on next)."""
    real = ocp.CheckpointManager.restore

    def restore(self, step, *args, **kwargs):
        tree = real(self, step, *args, **kwargs)
        leaves = jax.tree.leaves(tree)
        meshes = {json.dumps(dict(x.sharding.mesh.shape)) for x in leaves if hasattr(x.sharding, "mesh")}
        layers = tree["params"]["layers"]
        restored.append({
            "step": int(step), "meshes": sorted(meshes),
            "specs": {name: str(layers[name].sharding.spec) for name in ("wq", "wk", "wo", "w_down")},
            "lm_head_spec": str(tree["params"]["lm_head"].sharding.spec),
            "embed_spec": str(tree["params"]["embed"].sharding.spec),
            "wq_shard_shape": list(layers["wq"].addressable_shards[0].data.shape),
            "wq_shape": list(layers["wq"].shape)})
        return tree

    ocp.CheckpointManager.restore = restore


def config(mesh: str):
    data, fsdp, tensor = MESHES[mesh]
    return load_config(TINY_YAML, SETTINGS + [f"mesh.data={data}", f"mesh.fsdp={fsdp}", f"mesh.tensor={tensor}"])


def losses(metrics: dict) -> dict:
    return {str(step): m["loss/total"] for step, m in sorted(metrics.items())}


def main():
    _observe_restores()
    with tempfile.TemporaryDirectory(prefix="jf_jax_reshard_") as base:
        report = check(base)
    sys.stdout.flush()
    print(json.dumps(report))


def check(base: str) -> dict:
    full = run_training(config("A"), os.path.join(base, "full"), progress=False)
    run = os.path.join(base, "resumed")
    segments, resumed = [], {}
    for mesh, stop in SEGMENTS:
        before = len(restored)
        result = run_training(config(mesh), run, progress=False, stop_at_step=stop)
        segments.append({"mesh": mesh, "shape": dict(zip(("data", "fsdp", "tensor"), MESHES[mesh])),
                         "steps": sorted(result.metrics), "restored": restored[before:]})
        resumed.update(result.metrics)
    with open(os.path.join(run, train_loop.MESH_HISTORY_FILE)) as f:
        history = [json.loads(line) for line in f]
    snapshot = load_config(os.path.join(run, rd.CONFIG_FILE))
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), rd.load_run(full.run_dir)[1], rd.load_run(run)[1])
    report = {
        "devices": jax.device_count(),
        "uninterrupted": {"mesh": "A", "losses": losses(full.metrics)},
        "resumed": {"segments": segments, "losses": losses(resumed)},
        "metrics_diff": {str(step): {k: abs(resumed[step][k] - m[k]) / max(1.0, abs(m[k])) for k in m}
                         for step, m in sorted(full.metrics.items())},
        "mesh_history": history,
        "snapshot_mesh": {"data": snapshot.mesh.data, "fsdp": snapshot.mesh.fsdp, "tensor": snapshot.mesh.tensor},
        "final_step": {"uninterrupted": full.step, "resumed": max(resumed)},
        "max_param_diff": max(jax.tree.leaves(diffs)),
    }
    return report


if __name__ == "__main__":
    main()
