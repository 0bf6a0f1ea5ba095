"""Qwen2.5-7B's shapes on one GPU (AR against the bandwidth bound, the forward-latency knee, lossless decoding at
the fixed decode shape, the train step's memory and time): ``jf_jax.benchmarks.gpu_7b`` (``--help`` says more).

    python experiments/gpu_7b.py decode --out DIR [--budget-s 380]   # writes DIR/decode.json
    python experiments/gpu_7b.py train --out DIR [--budget-s 200]    # writes DIR/train.json
    python experiments/gpu_7b.py report --out DIR                    # the tuner's choice and the tables
"""

import sys

from jf_jax.benchmarks.gpu_7b import main

if __name__ == "__main__":
    sys.exit(main())
