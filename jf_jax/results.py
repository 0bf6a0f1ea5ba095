"""``python -m jf_jax.results``: the same as ``jf-jax results`` (the command itself is ``jf_jax.cli.results``)."""

import sys

from jf_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["results", *sys.argv[1:]]))
