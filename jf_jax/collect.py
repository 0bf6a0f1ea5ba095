"""``python -m jf_jax.collect``: collect a model's Jacobi trajectories (training data); see ``jf_jax.cli.collect``."""

import sys

from jf_jax.cli.collect import main

if __name__ == "__main__":
    sys.exit(main())
