"""Jacobi Forcing training, in data-flow order: trajectories -> noise schedule -> packed batches -> losses ->
train state and step -> a run set up from its config -> the loop that runs it (checkpoints, metrics).

* ``trajectories``: on-disk trajectory shards, resumable collection, readers.
* ``noise_schedule``, ``packing``: noisy/clean packing with per-token stream and block ids.
* ``losses``: consistency + AR losses over a packed batch.
* ``state``, ``step``: optax state and the sharded, jitted train step.
* ``config``, ``setup``, ``loop``: YAML run configs (strict), a run set up from one (model source, data, mesh,
  teacher) and the host loop that runs it with exact orbax resume.
* ``tensorboard``: event files without TensorFlow; ``synthetic``: a task whose Jacobi TPF training must raise.
"""
