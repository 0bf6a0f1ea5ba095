"""The Jacobi Forcing train step on SmolLM2-135M, variants side by side: ``jf_jax.benchmarks.train_step``
(``--help`` lists the options).

    python experiments/bench_train_step.py --variants float32,bfloat16,bfloat16-remat \\
        --json results/studies/train_step_speed/train_step.json
    python experiments/bench_train_step.py --variants float32,bfloat16-remat --batch 1,4,8 --steps 5
"""

import sys

from jf_jax.benchmarks.train_step import main

if __name__ == "__main__":
    sys.exit(main(program="python experiments/bench_train_step.py"))
