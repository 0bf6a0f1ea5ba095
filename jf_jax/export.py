"""``python -m jf_jax.export``: the same as ``jf-jax export`` (the command itself is ``jf_jax.cli.export``)."""

import sys

from jf_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]]))
