"""Lever ablations for Jacobi Forcing on a real model (short training runs that differ in one setting each, every
one measured by held-out Jacobi TPF): ``jf_jax.benchmarks.ablation`` (``--help`` says how variants are named,
resumed and tabled).

    python experiments/ablate.py configs/smollm2_jf.yaml --steps 60 \\
        --variant "ar_only: loss.consistency_weight=0" --variant "cw20: loss.consistency_weight=20" \\
        --prompts runs/prompts/code_heldout.jsonl --prompts runs/prompts/math_heldout.jsonl --limit 3 \\
        --out results/studies/levers_n8/ablation
"""

import sys

from jf_jax import host_memory  # imports no JAX
from jf_jax.benchmarks.ablation import main  # imports no JAX

if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # before JAX loads: XLA's per-step buffers reused, not re-faulted
    sys.exit(main(program="python experiments/ablate.py"))
