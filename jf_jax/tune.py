"""``python -m jf_jax.tune``: the same as ``jf-jax tune`` (the command itself is ``jf_jax.cli.tune``)."""

import sys

from jf_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
