"""``python -m jf_jax.prompts``: build the training and held-out prompt files offline; see ``jf_jax.cli.prompts``."""

import sys

from jf_jax.cli.prompts import main

if __name__ == "__main__":
    sys.exit(main())
