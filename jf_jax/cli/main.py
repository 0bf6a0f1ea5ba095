"""``jf-jax COMMAND ...`` (the console script; also ``python -m jf_jax COMMAND ...``): one entry for every command.

Each command is also its own module, ``python -m jf_jax.COMMAND``; ``jf-jax COMMAND --help`` shows its options.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "decode": ("jf_jax.cli.decode", "generate with AR / Jacobi / multi-block decoding and compare their speed"),
    "prompts": ("jf_jax.cli.prompts", "build the training and held-out prompt files (offline)"),
    "collect": ("jf_jax.cli.collect", "collect a model's Jacobi trajectories on prompts (training data)"),
    "train": ("jf_jax.cli.train", "train a Jacobi Forcing model from a YAML config (resumable)"),
    "evaluate": ("jf_jax.cli.evaluate", "speed (TPF, x AR) and quality of models on held-out prompts"),
    "export": ("jf_jax.cli.export", "write any model jf-jax loads as a Hugging Face directory"),
    "plan": ("jf_jax.cli.plan", "before renting accelerators: does a run fit, what it costs (compiled, no weights)"),
    "tune": ("jf_jax.cli.tune", "measure this machine and choose block size and verification rows"),
    "serve": ("jf_jax.serving.command", "an OpenAI-compatible server: continuous batching, lossless Jacobi inside"),
    "doctor": ("jf_jax.cli.doctor", "what this machine gives jf-jax: backend, CPU features, kernels, dtype paths"),
    "results": ("jf_jax.cli.results", "regenerate docs/results.md (and README's results table) from results/<run>/"),
    "study": ("jf_jax.pipeline.command", "run a study file: prompts -> collect -> train -> evaluate (resumable)"),
}
"""command -> (module with ``main(argv) -> int``, one line of help), in pipeline order."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "usage: jf-jax COMMAND [options]   (jf-jax COMMAND --help for its options)\n\ncommands:\n" + "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"{usage()}\njf-jax: error: unknown command {command!r}", file=sys.stderr)
        return 2
    if command == "train":
        from jf_jax import host_memory  # imports no JAX

        host_memory.reexec_with_tuned_malloc()  # before JAX loads (see jf_jax.host_memory); returns if not needed
    return importlib.import_module(COMMANDS[command][0]).main(rest)
