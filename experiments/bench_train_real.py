"""A training config's real batches timed side by side at several recipes (batch size, AR teacher):
``jf_jax.benchmarks.train_real`` (``--help`` says how examples are drawn and timed).

    python experiments/bench_train_real.py configs/smollm2_jf_n16_b4.yaml --examples 48 \\
        --variant 'b1_ce: data.batch_size=1 loss.ar_teacher=data' --variant 'b4_ce: loss.ar_teacher=data' \\
        --variant 'b4_kl:' --json results/studies/train_step_speed/train_step_real.json
"""

import sys

from jf_jax import host_memory  # imports no JAX
from jf_jax.benchmarks.train_real import main  # imports no JAX

if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # as a training run: time the allocator a run has
    sys.exit(main(program="python experiments/bench_train_real.py"))
