"""``python -m jf_jax.doctor``: what this machine gives jf-jax; the command itself is ``jf_jax.cli.doctor``."""

import sys

from jf_jax.cli.doctor import main

if __name__ == "__main__":
    sys.exit(main())
