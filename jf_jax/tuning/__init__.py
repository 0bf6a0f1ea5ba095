"""Hardware-aware configuration of the block decoders: ``measure`` (latency curve, TPF grid), ``roofline`` (GPU
models), ``tuner`` (prediction, choice per device, report), ``plots``. The command line is ``jf_jax.cli.tune``."""
