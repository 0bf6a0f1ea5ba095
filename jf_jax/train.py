"""``python -m jf_jax.train``: train a Jacobi Forcing model from a YAML config; the same as ``jf-jax train``
(``jf_jax.cli.main``, which re-executes under the tuned allocator before JAX loads, then runs ``jf_jax.cli.train``)."""

import sys

from jf_jax.cli.main import main  # imports no JAX

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
