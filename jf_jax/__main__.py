"""``python -m jf_jax COMMAND ...``: the same as the ``jf-jax`` console script (``jf_jax.cli.main``)."""

import sys

from jf_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
