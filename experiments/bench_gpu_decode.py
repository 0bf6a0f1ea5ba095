"""AR decoding speed of SmolLM2-135M's shapes against the memory-bandwidth bound, on whatever backend runs it:
``jf_jax.benchmarks.gpu_decode`` (``--help`` says what is measured and how to compare CUDA-graph settings).

    python experiments/bench_gpu_decode.py --decode-shapes none,1x16,4x32 --json decode.json
    python experiments/bench_gpu_decode.py --config tiny --tokens 8 --repeats 2 --bandwidth-mib 8   # CPU smoke
"""

import sys

from jf_jax.benchmarks.gpu_decode import main

if __name__ == "__main__":
    sys.exit(main(program="python experiments/bench_gpu_decode.py"))
