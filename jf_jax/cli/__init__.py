"""Command lines, thin layers over the library: ``main`` (the ``jf-jax`` console script) dispatches to ``decode``,
``prompts``, ``collect``, ``train``, ``evaluate``, ``export`` and ``tune``, each also ``python -m jf_jax.COMMAND``
(``export`` and ``tune``: ``python -m jf_jax.cli.export`` / ``jf_jax.cli.tune``); ``tuning_run`` is the tuner run
``decode --tune`` and ``tune`` share."""
