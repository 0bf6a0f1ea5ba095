"""``python -m jf_jax.evaluate``: speed (TPF, tokens/s against AR) and quality of models on held-out prompts; see
``jf_jax.cli.evaluate``."""

import sys

from jf_jax.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
