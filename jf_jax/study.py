"""``python -m jf_jax.study FILE``: run a study (configs/studies/*.yaml); the same as ``jf-jax study``
(``jf_jax.pipeline.command``)."""

import sys

from jf_jax.pipeline.command import main

if __name__ == "__main__":
    sys.exit(main())
