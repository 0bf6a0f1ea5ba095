"""Held-out Jacobi TPF against HumanEval reference-solution NLL for the lever tables of ``ablation``
(one point per variant; several tables share the axes when their base rows agree), so the trade-off between speed
gained and quality lost reads at a glance.

    python experiments/plot_levers.py results/studies/levers_n16/levers_n16.md \
        results/studies/levers_n16/levers_n16_kl.md \
        --out results/studies/levers_n16/levers_n16_tradeoff.png
"""

from __future__ import annotations

import argparse
import os
import sys

from jf_jax.benchmarks.ablation import read_table


def plot(tables: dict[str, list[dict]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    seen = set()
    for (path, rows), marker, color in zip(tables.items(), "os^Dv", ("tab:blue", "tab:orange", "tab:green",
                                                                       "tab:red", "tab:purple")):
        label = os.path.splitext(os.path.basename(path))[0]
        for r in rows:
            if r["name"] == "base" and "base" in seen:
                continue
            seen.add(r["name"])
            base = r["name"] == "base"
            ax.scatter(r["nll"], r["tpf"], marker=marker, color="grey" if base else color,
                       label=None if base else label)
            label = label if base else None  # one legend entry per table
            ax.annotate(r["name"], (r["nll"], r["tpf"]), textcoords="offset points", xytext=(4, 3), fontsize=8)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("HumanEval reference-solution NLL (nats/token; lower keeps quality)")
    ax.set_ylabel("held-out Jacobi TPF (higher is faster)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="+", help="ablate.py markdown tables (OUT.md)")
    p.add_argument("--out", required=True, help="PNG path")
    args = p.parse_args(argv)
    try:
        tables = {path: read_table(path) for path in args.tables}
    except (OSError, ValueError, KeyError) as e:
        p.error(str(e))
    bases = {(r["tpf"], r["nll"]) for rows in tables.values() for r in rows if r["name"] == "base"}
    if len(bases) > 1:
        p.error(f"the tables' base rows differ ({sorted(bases)}): they were not measured the same way")
    plot(tables, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
