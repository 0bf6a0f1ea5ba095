"""``python -m jf_jax.serve``: the same as ``jf-jax serve`` (the command itself is ``jf_jax.serving.command``)."""

import sys

from jf_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
