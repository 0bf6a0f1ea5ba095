"""``python -m jf_jax.cli.export MODEL OUT_DIR``: any model jf-jax loads (a training run directory, a GGUF, a
model name) written as a Hugging Face directory that transformers loads on its own::

    python -m jf_jax.cli.export runs/smollm2_jf_n16 exports/smollm2_jf_n16
    python -c "import transformers as t; m = t.AutoModelForCausalLM.from_pretrained('exports/smollm2_jf_n16')"

The layout is documented in ``jf_jax.weights.hf_export``; weights are float32.
"""

from __future__ import annotations

import argparse
import sys

from jf_jax import weights
from jf_jax.weights.hf_export import check_destination, export_hf


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="weights spec: a training RUN_DIR, a .gguf, a HF directory or a model name")
    p.add_argument("out", help="directory to write (must not exist, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in OUT")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        check_destination(args.out, args.overwrite)
        loaded = weights.load(args.model, dtype="float32")
        path = export_hf(loaded.cfg, loaded.params, loaded.tokenizer, args.out, overwrite=args.overwrite)
    except (ValueError, OSError) as e:  # our errors are ValueErrors naming the problem
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {loaded.name} ({loaded.cfg.architecture}, {loaded.cfg.num_layers} layers) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
