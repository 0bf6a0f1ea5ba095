"""``python -m jf_jax.cli.tune``: the hardware-aware tuner's command line, with every knob of the grid
(``python -m jf_jax.decode --tune`` runs the tuner with the grid's defaults).

Reads the prompts (``--prompt`` / ``--prompts``, else the first built-in prompts), runs ``jf_jax.api.tune`` (load,
encode, ``jf_jax.tuning.tuner.tune``) and prints the chosen configuration per device. The measurements, the
choice and the outputs are described in ``jf_jax.tuning.tuner``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from jf_jax.data.prompt_files import gather_prompts
from jf_jax.tuning import measure, tuner

# Grid options handed to ``tuner.tune`` when the namespace has them (the decode CLI's has only some).
GRID_OPTIONS = ("latency_sizes", "repeats", "context", "block_sizes", "pool_sizes", "max_new_tokens", "num_blocks",
                "spawn_ratio", "seed")


def _ints(text: str) -> tuple[int, ...]:
    """argparse type: a comma list of integers, e.g. "4,8,16"."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jf_jax.cli.tune", description=tuner.__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", type=Path, help=".jsonl file with a 'prompt' field per line, or .txt, one per line")
    p.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template")
    p.add_argument("--tune-out", type=Path, default=tuner.DEFAULT_DIR)
    p.add_argument("--latency-sizes", type=_ints, default=measure.LATENCY_SIZES)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--context", type=int, default=128, help="committed KV slots of the latency measurement")
    p.add_argument("--block-sizes", type=_ints, default=measure.BLOCK_SIZES)
    p.add_argument("--pool-sizes", type=_ints, default=measure.POOL_SIZES)
    p.add_argument("--num-blocks", type=int, default=measure.NUM_BLOCKS, help="K of the grid (1: Jacobi + recycling)")
    p.add_argument("--spawn-ratio", type=float, default=0.85)
    p.add_argument("--max-new-tokens", type=int, default=measure.TUNE_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tpf-from", type=Path, help="reuse the TPF grid of this tuned.json; only re-measure latency")
    return p


def grid_options(args) -> dict:
    """The ``tuner.tune`` options a CLI namespace carries (the decode CLI's has only some of them)."""
    opts = dict(out_dir=Path(getattr(args, "tune_out", None) or tuner.DEFAULT_DIR))
    opts.update({name: getattr(args, name) for name in GRID_OPTIONS if getattr(args, name, None) is not None})
    if getattr(args, "tpf_from", None) is not None:
        earlier = json.loads(Path(args.tpf_from).read_text())
        if not isinstance(earlier, dict) or "tpf" not in earlier or "grid" not in earlier:
            raise ValueError(f"{args.tpf_from} is not a tuner report (no TPF grid)")
        opts["cells"] = measure.cells_from_report(earlier)
        opts.update({k: earlier["grid"][k] for k in ("spawn_ratio", "max_new_tokens", "seed") if k in earlier["grid"]})
    return opts


def run_from_args(args, prompts: Sequence[str], command: str) -> dict:
    """Tunes ``args.model`` on ``prompts`` with the grid options ``args`` carries; prints the summary."""
    from jf_jax import api

    opts = grid_options(args)
    print(f"loading {args.model} ({args.dtype}) ...", file=sys.stderr)
    report = api.tune(args.model, prompts, dtype=args.dtype, chat=not args.no_chat, command=command, **opts)
    print("\n".join(tuner.summary_lines(report)))
    print(f"wrote {opts['out_dir'] / tuner.JSON_NAME}, latency.png, tokens_per_second.png", file=sys.stderr)
    return report


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        prompts = gather_prompts(args.prompt, args.prompts, limit_builtin=measure.TUNE_PROMPTS)
        run_from_args(args, prompts, command=" ".join(["python -m jf_jax.cli.tune"] + argv))
    except (ValueError, OSError) as e:  # our errors are ValueErrors naming the problem
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
