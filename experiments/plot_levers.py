"""Held-out Jacobi TPF against HumanEval reference-solution NLL for the lever tables of ``experiments/ablate.py``:
``jf_jax.benchmarks.lever_plot``.

    python experiments/plot_levers.py results/studies/levers_n16/levers_n16.md \\
        results/studies/levers_n16/levers_n16_kl.md \\
        --out results/studies/levers_n16/levers_n16_tradeoff.png
"""

import sys

from jf_jax.benchmarks.lever_plot import main

if __name__ == "__main__":
    sys.exit(main())
