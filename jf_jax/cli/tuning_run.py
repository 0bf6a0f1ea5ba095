"""Running the tuner from a command line and printing its result: shared by ``python -m jf_jax.cli.tune`` (every
knob of the grid) and ``python -m jf_jax.decode --tune`` (the grid's defaults), so neither CLI imports the other."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from jf_jax.cli.output_paths import directory_problem
from jf_jax.tuning import measure, tuner

# Every grid option of ``tuner.tune`` a CLI namespace may set (``python -m jf_jax.cli.tune`` sets them all).
GRID_OPTIONS = ("latency_sizes", "repeats", "context", "block_sizes", "pool_sizes", "max_new_tokens", "num_blocks",
                "spawn_ratio", "seed")


def grid_options(args, names: Sequence[str] = GRID_OPTIONS) -> dict:
    """The ``tuner.tune`` options among ``names`` that a CLI namespace sets, its output directory and a
    ``--tpf-from`` report's TPF grid."""
    opts = dict(out_dir=Path(args.tune_out) if getattr(args, "tune_out", None) else tuner.default_dir())
    opts.update({name: getattr(args, name) for name in names if getattr(args, name, None) is not None})
    if getattr(args, "tpf_from", None) is not None:
        earlier = json.loads(Path(args.tpf_from).read_text())
        if not isinstance(earlier, dict) or "tpf" not in earlier or "grid" not in earlier:
            raise ValueError(f"{args.tpf_from} is not a tuner report (no TPF grid)")
        opts["cells"] = measure.cells_from_report(earlier)
        opts.update({k: earlier["grid"][k] for k in ("spawn_ratio", "max_new_tokens", "seed") if k in earlier["grid"]})
    return opts


def tune_and_report(args, prompts: Sequence[str], command: str, names: Sequence[str] = GRID_OPTIONS) -> dict:
    """Tunes ``args.model`` on ``prompts`` with the grid options among ``names`` that ``args`` sets; prints the
    chosen configurations and the files written; returns the report. Raises ``ValueError`` (which both CLIs print
    in one line) when the output directory cannot be written, before any measurement."""
    from jf_jax import api

    opts = grid_options(args, names)
    problem = directory_problem(str(opts["out_dir"]))  # before the model loads and the grid is measured
    if problem:
        raise ValueError(f"cannot write the tuner's output directory {opts['out_dir']}: {problem}")
    print(f"loading {args.model} ({args.dtype}) ...", file=sys.stderr)
    report = api.tune(args.model, prompts, dtype=args.dtype, chat=not args.no_chat, command=command, **opts)
    print("\n".join(tuner.summary_lines(report)))
    print(f"wrote {opts['out_dir'] / tuner.JSON_NAME}, latency.png, tokens_per_second.png", file=sys.stderr)
    return report
