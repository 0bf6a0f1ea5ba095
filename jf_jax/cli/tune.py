"""``python -m jf_jax.cli.tune``: the hardware-aware tuner's command line, with every knob of the grid
(``python -m jf_jax.decode --tune`` runs the tuner with the grid's defaults).

Reads the prompts (``--prompt`` / ``--prompts``, else the first built-in prompts), runs ``jf_jax.api.tune`` (load,
encode, ``jf_jax.tuning.tuner.tune``) and prints the chosen configuration per device. The measurements, the
choice and the outputs are described in ``jf_jax.tuning.tuner``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jf_jax.cli.tuning_run import tune_and_report
from jf_jax.data.prompt_files import gather_prompts
from jf_jax.tuning import measure, tuner

def positive_ints(text: str) -> tuple[int, ...]:
    """argparse type: a comma list of positive integers, e.g. "4,8,16" (also used by ``python -m jf_jax.evaluate``)."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax tune", description=tuner.__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", type=Path, help=".jsonl file with a 'prompt' field per line, or .txt, one per line")
    p.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template")
    p.add_argument("--tune-out", type=Path,
                   help="output directory (default: $JF_JAX_CACHE/tune, else ~/.cache/jf_jax/tune)")
    p.add_argument("--latency-sizes", type=positive_ints, default=measure.LATENCY_SIZES)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--context", type=int, default=128, help="committed KV slots of the latency measurement")
    p.add_argument("--block-sizes", type=positive_ints, default=measure.BLOCK_SIZES)
    p.add_argument("--pool-sizes", type=positive_ints, default=measure.POOL_SIZES)
    p.add_argument("--num-blocks", type=int, default=measure.NUM_BLOCKS, help="K of the grid (1: Jacobi + recycling)")
    p.add_argument("--spawn-ratio", type=float, default=0.85)
    p.add_argument("--max-new-tokens", type=int, default=measure.TUNE_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tpf-from", type=Path, help="reuse the TPF grid of this tuned.json; only re-measure latency")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        prompts = gather_prompts(args.prompt, args.prompts, limit_builtin=measure.TUNE_PROMPTS)
        tune_and_report(args, prompts, command=" ".join(["python -m jf_jax.cli.tune"] + argv))
    except (ValueError, OSError) as e:  # our errors are ValueErrors naming the problem
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
