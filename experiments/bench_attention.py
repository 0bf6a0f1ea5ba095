"""The tile-skipping flash-attention kernel on the Jacobi Forcing training mask: skipped tiles, and on a GPU its
forward (and with ``--backward`` forward + backward) time against dense masked attention:
``jf_jax.benchmarks.attention`` (``--help`` lists the options and more command lines).

    python experiments/bench_attention.py --dry-run --backward            # sparsity + the backward smoke check
    python experiments/bench_attention.py --batch 8 --tiles 128x32,128x64 --backward --iters 50 --json a768.json
"""

from jf_jax.benchmarks.attention import main

if __name__ == "__main__":
    main()
