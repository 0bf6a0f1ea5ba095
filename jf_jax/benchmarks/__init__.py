"""The benchmarks' and studies' machinery, run as ``python -m jf_jax.benchmarks.NAME`` (``experiments/`` holds
thin callers with the recorded command lines): the GPU decode bench (``gpu_decode``), the 7B parts
(``gpu_7b``), the train step on synthetic and on real batches (``train_step``, ``train_real``), the attention
kernel's bench (``attention``), lever ablations and their trade-off plot (``ablation``, ``lever_plot``), and
what several of them share (``records``: error lines and section records; ``device``: bandwidth, the named
configs, random prompts; ``transformers_speed``: transformers' ``generate`` timed).

Nothing here is imported by the decoders or the training; importing this package imports no JAX."""
