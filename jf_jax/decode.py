"""``python -m jf_jax.decode``: the decoding CLI's stable entry point; the CLI itself is ``jf_jax.cli.decode``."""

import sys

from jf_jax.cli.decode import main

if __name__ == "__main__":
    sys.exit(main())
