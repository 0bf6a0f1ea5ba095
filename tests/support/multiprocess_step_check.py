"""One process of a 2-process ``jax.distributed`` run: the train step over a global 2 x 4 ("data", "fsdp") mesh of
2 processes x 4 simulated CPU devices, against the single-device step computed in the same process.

Started twice by tests/test_multiprocess.py (``python -m tests.support.multiprocess_step_check PORT PROCESS_ID``)
with XLA_FLAGS=--xla_force_host_platform_device_count=4; the processes meet at localhost:PORT (JAX's own
coordination service) and reduce across each other with gloo collectives. Process 0 prints a JSON report on its
last stdout line. On a TPU slice or a GPU cluster the same code runs with ``jax.distributed.initialize()`` reading
the coordinator from the environment, and the mesh spans every process's accelerators.
"""

import json
import sys

import jax


def main(port: int, process_id: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id)
    import numpy as np
    from jax.experimental import multihost_utils

    from jf_jax.model.sharding import make_mesh
    from jf_jax.training.state import OptimConfig
    from tests.support.sharded_step_check import batch, run

    host_batch = batch()  # every process builds the same global batch; each keeps its own rows on its devices
    ocfg = OptimConfig(learning_rate=1e-2, warmup_steps=0, clip_norm=1.0, weight_decay=0.1)
    local, local_metrics, _ = run(make_mesh(1, 1, jax.local_devices()[:1]), ocfg, host_batch)
    mesh = make_mesh(2, 4)  # the global mesh: both processes' devices
    state, metrics, shardings = run(mesh, ocfg, host_batch)
    gathered = multihost_utils.process_allgather(state.params, tiled=True)
    ref = jax.device_get(local.params)
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), gathered, ref)
    report = dict(process_count=jax.process_count(), global_devices=jax.device_count(),
                  local_devices=jax.local_device_count(), mesh=dict(mesh.shape),
                  mesh_processes=sorted({d.process_index for d in mesh.devices.flat}),
                  params_sharded="fsdp" in str(shardings.params["layers"]["wq"].spec),
                  max_param_diff=max(jax.tree.leaves(diffs)),
                  metrics_diff={k: abs(metrics[k] - local_metrics[k]) / max(1.0, abs(local_metrics[k]))
                                for k in local_metrics})
    if process_id == 0:
        print(json.dumps(report), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
