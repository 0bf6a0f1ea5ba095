"""``python -m jf_jax.plan``: the same as ``jf-jax plan`` (the command itself is ``jf_jax.cli.plan``)."""

import sys

from jf_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["plan", *sys.argv[1:]]))
