"""Command lines, thin layers over ``jf_jax.api``: ``decode`` (``python -m jf_jax.decode``) and ``tune``
(``python -m jf_jax.cli.tune``), and ``tuning_run``, the tuner run both share. Neither CLI imports the other."""
