"""The tables of results/studies/plan_7b/README.md from the plans experiments/plan_7b.sh wrote.

    python experiments/plan_7b_table.py results/studies/plan_7b
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

GIB = 2**30


def wall_seconds(log: Path) -> str:
    match = re.search(r"exit status (\d+), (\d+) s wall", log.read_text()) if log.exists() else None
    return f"{match.group(2)} s (exit {match.group(1)})" if match else "?"


def train_row(name: str, p: dict, log: Path) -> str:
    t, r, rnd = p["train"], p.get("decode"), p["round"]
    d, a = t["per_device"], t["analytic_per_device"]
    coll = t["collectives"]["total_collective_bytes"] / 1e9
    collect = (f"{rnd['collect_chip_hours_at_bound']:,.0f} / {rnd['collect_chip_hours_at_measured_fraction']:,.0f}"
               if r else "-")
    compile_s = f"{t['compile_seconds']:.0f}" + (f" + {r['compile_seconds']['jacobi']:.0f} + "
                                                  f"{r['compile_seconds']['ar']:.0f}" if r else "")
    return (f"| {name} | {p['mesh']} | {d['peak_bytes'] / GIB:.1f} | {d['calibrated_peak_bytes'] / GIB:.1f} | "
            f"{a['total_bytes'] / GIB:.1f} | {p['target']['hbm_bytes'] / GIB:.0f} | {t['verdict']} | {coll:.0f} | "
            f"{t['step_seconds']:.2f} / {t['step_seconds_with_collectives']:.2f} | "
            f"{rnd['train_chip_hours']:,.0f} / {rnd['train_chip_hours_with_collectives']:,.0f} | {collect} | "
            f"{compile_s} s; {wall_seconds(log)} |")


def decode_row(name: str, p: dict, log: Path) -> str:
    r, s = p["decode"], p["decode_settings"]
    d = r["per_device"]
    coll = r["collectives"]["ar"]["total_collective_bytes"] / 1e6
    knee = r["knee_tokens_per_row"]
    return (f"| {name} | {p['decode_mesh']} | {s['batch']} | {(d['weights_bytes'] + d['embedding_bytes']) / GIB:.2f} | "
            f"{d['kv_cache_bytes'] / GIB:.2f} | {d['peak_bytes'] / GIB:.2f} | {r['verdict']} | "
            f"{r['ar_tokens_per_second']:,.0f} / {r['ar_tokens_per_second_at_measured_fraction']:,.0f} | "
            f"{r['jacobi_over_ar']:.2f} | {'n/a' if math.isnan(knee) else f'{knee:.0f}'} | {coll:.0f} | "
            f"{r['collective_seconds']['ar'] * 1e3:.2f} | {r['compile_seconds']['jacobi']:.0f} + "
            f"{r['compile_seconds']['ar']:.0f} s; {wall_seconds(log)} |")


def main(out: Path) -> int:
    plans = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    print("| plan | mesh | XLA:CPU peak GiB/device | calibrated | analytic floor | HBM GiB | verdict | collectives "
          "GB/step/device | step s (compute only / collectives overlapped) | train chip-h per round (compute only / "
          "collectives overlapped) | collection chip-h (roofline / at 49.6%) | compile (train + jacobi + AR); wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, p in plans.items():
        if p.get("train"):
            print(train_row(name, p, out / f"{name}.log"))
    print("\n| plan | decode mesh | rows | weights GiB/device | KV GiB | peak GiB | verdict | AR tok/s (bound / at "
          "49.6%) | Jacobi / AR step | knee (tokens/row) | AR collectives MB/step | at link rate ms | compile; wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, p in plans.items():
        if p.get("decode"):
            print(decode_row(name, p, out / f"{name}.log"))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
