"""``python -m jf_jax.train``: train a Jacobi Forcing model from a YAML config; see ``jf_jax.cli.train``."""

import sys

from jf_jax import host_memory  # imports no JAX

if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # first, before JAX loads: XLA's per-step buffers reused, not re-faulted

from jf_jax.cli.train import main  # noqa: E402  (after the re-exec above)

if __name__ == "__main__":
    sys.exit(main())
