"""The learning curve of a study trained at several sizes (``report: curve``), from its evaluations.

Reads every ``eval_<arm>_<size>.json`` (``jf-jax evaluate`` output) of a results folder, with its
``nll_<arm>_<size>.json`` or ``humaneval_<arm>_<size>.json`` where there is one, and ``responses.json`` (size ->
responses kept), and writes ``curve.json``, ``curve.md`` and ``curve.png``: per (arm, responses) the held-out TPF of
jacobi and mr without looping answers (mean per prompt, with its bootstrap 95% interval), the loop rate, TPF on
training prompts, the NLL of HumanEval's canonical solutions (quality), and per arm and method the least-squares
slope of TPF against log2(responses) with what it predicts at 10,000 responses.

    python -m jf_jax.pipeline.curve results/studies/data_scale/cpu     # the report again, without the study
"""


from __future__ import annotations

import glob
import json
import math
import os
import re
import sys

import numpy as np

PREDICT_AT = 10_000


def read_point(path: str) -> dict:
    """One evaluation as a curve point: per method, held-out (all held-out sets pooled) and training-prompt
    summaries of the per-prompt records."""
    from jf_jax.decoding.stats import summarize_with_loops

    with open(path) as f:
        result = json.load(f)["results"][0]
    arm, size = re.fullmatch(r"eval_(\w+?)_(\d+)\.json", os.path.basename(path)).groups()
    train_sets = set(result.get("train_sets", []))
    pooled: dict[str, dict[str, list]] = {}
    for set_name, runs in result["speed"].items():
        split = "train" if set_name in train_sets else "heldout"
        for run_name, summary in runs.items():
            pooled.setdefault(run_name, {}).setdefault(split, []).extend(summary["per_prompt"])
    methods = {}
    for run_name, splits in pooled.items():
        methods[run_name] = {split: summarize_with_loops(records) for split, records in splits.items()}
    return dict(arm=arm, size=int(size), responses=result.get("responses"), methods=methods,
                humaneval_nll=read_nll(os.path.dirname(path), arm, size))


def read_nll(folder: str, arm: str, size: str) -> dict | None:
    """The point's HumanEval solution NLL, from the nll stage's file or else from a HumanEval run's (which scores
    the solutions too); None when neither has it."""
    for prefix in ("nll", "humaneval"):
        path = os.path.join(folder, f"{prefix}_{arm}_{size}.json")
        if os.path.exists(path):
            with open(path) as f:
                scored = json.load(f)["results"][0].get("humaneval_nll")
            if scored:
                return dict(problems=scored["problems"], nll_per_token=scored["nll_per_token"],
                            per_problem={i["task_id"]: i["nll"] / max(i["tokens"], 1) for i in scored["items"]})
    return None


def add_nll_change(points: list[dict]) -> None:
    """Each trained point's NLL change from the base: the mean over the problems both scored of the difference in
    NLL per solution token, with its paired bootstrap 95% interval (the problems' own spread is far larger than
    what a fine-tune moves, so only the paired difference resolves it)."""
    from jf_jax.decoding.stats import bootstrap_mean_interval

    base = next((p["humaneval_nll"] for p in points if p["arm"] == "base" and p["humaneval_nll"]), None)
    for p in points:
        nll = p["humaneval_nll"]
        if base is None or nll is None or p["arm"] == "base":
            continue
        shared = sorted(set(nll["per_problem"]) & set(base["per_problem"]))
        diffs = [nll["per_problem"][t] - base["per_problem"][t] for t in shared]
        if not diffs:  # scored on other problems than the base: nothing to pair
            continue
        nll["change_from_base"] = dict(problems=len(diffs), mean=float(np.mean(diffs)),
                                       ci95=bootstrap_mean_interval(diffs))


def nll_text(nll: dict | None) -> str:
    if nll is None:
        return "-"
    change = nll.get("change_from_base")
    if change is None:
        return f"{nll['nll_per_token']:.3f}"
    low, high = change["ci95"]
    return f"{nll['nll_per_token']:.3f} ({change['mean']:+.3f} [{low:+.3f}, {high:+.3f}])"


def fit(points: list[tuple[float, float]]) -> dict | None:
    """TPF = a + b log2(responses): the slope b per doubling and the prediction at ``PREDICT_AT``."""
    if len(points) < 2:
        return None
    x = np.log2([p[0] for p in points])
    y = np.asarray([p[1] for p in points])
    slope, intercept = np.polyfit(x, y, 1)
    return dict(slope_per_doubling=float(slope), intercept=float(intercept), points=len(points),
                predicted_at_10k=float(intercept + slope * math.log2(PREDICT_AT)))


def write_curve(folder: str) -> list[str] | None:
    """Writes the curve's files in ``folder`` and returns its markdown lines; None when it holds no evaluation."""
    paths = sorted(glob.glob(os.path.join(folder, "eval_*_*.json")))
    if not paths:
        return None
    points = [read_point(p) for p in paths]
    responses_file = os.path.join(folder, "responses.json")  # written by the study: size -> responses kept
    kept = json.load(open(responses_file)) if os.path.exists(responses_file) else {}
    for pt in points:
        pt["responses"] = kept.get(str(pt["size"]), pt["size"]) if pt["size"] else 0
    add_nll_change(points)
    fits = {}
    for arm in sorted({p["arm"] for p in points} - {"base"}):
        for method in sorted({m for p in points for m in p["methods"]}):
            xy = [(p["responses"], (p["methods"][method]["heldout"].get("without_loops") or {}).get("mean_tpf"))
                  for p in points if p["arm"] == arm and method in p["methods"]]
            xy = [(x, y) for x, y in xy if x and y is not None]
            fits[f"{arm} {method}"] = fit(sorted(xy))
    with open(os.path.join(folder, "curve.json"), "w") as f:
        json.dump(dict(points=points, fits=fits), f, indent=1)
    lines = ["| arm | responses | method | held-out mean TPF w/o loops [95% CI] | loop rate | held-out mean TPF (all) "
             "| train-prompt mean TPF w/o loops | HumanEval solution NLL (change from base [95% CI]) |",
             "|---|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p["arm"] != "base", p["arm"], p["size"])):
        for method, splits in sorted(p["methods"].items()):
            held, train = splits.get("heldout", {}), splits.get("train", {})
            wl = held.get("without_loops") or {}
            ci = wl.get("mean_tpf_ci95") or [float("nan")] * 2
            twl = (train.get("without_loops") or {}).get("mean_tpf", float("nan"))
            nll = nll_text(p["humaneval_nll"])
            lines.append(f"| {p['arm']} | {p['responses']} | {method} | {wl.get('mean_tpf', float('nan')):.3f} "
                         f"[{ci[0]:.3f}, {ci[1]:.3f}] | {held.get('loop_rate', float('nan')):.2f} | "
                         f"{held.get('mean_tpf', float('nan')):.3f} | {twl:.3f} | {nll} |")
    lines += ["", "| arm, method | slope per doubling | predicted at 10k responses | points |", "|---|---|---|---|"]
    for name, fitted in fits.items():
        if fitted:
            lines.append(f"| {name} | {fitted['slope_per_doubling']:+.3f} | {fitted['predicted_at_10k']:.2f} | "
                         f"{fitted['points']} |")
    with open(os.path.join(folder, "curve.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(points, os.path.join(folder, "curve.png"))
    return lines


def plot(points: list[dict], path: str) -> None:
    """Held-out TPF against responses (left) and the solution-NLL change from the base (right), per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_nll) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in sorted({p["arm"] for p in points} - {"base"}):
        for method in sorted({m for p in points for m in p["methods"]}):
            xy = sorted((p["responses"], (p["methods"][method]["heldout"].get("without_loops") or {}).get("mean_tpf"))
                        for p in points if p["arm"] == arm and method in p["methods"])
            xy = [(x, y) for x, y in xy if y is not None]
            if xy:
                ax.plot(*zip(*xy), marker="o", label=f"{arm} {method}")
        changes = sorted((p["responses"], p["humaneval_nll"]["change_from_base"]) for p in points
                         if p["arm"] == arm and p["humaneval_nll"] and "change_from_base" in p["humaneval_nll"])
        if changes:
            x = [c[0] for c in changes]
            mean = np.array([c[1]["mean"] for c in changes])
            ci = np.array([c[1]["ci95"] for c in changes]).T
            ax_nll.errorbar(x, mean, yerr=[mean - ci[0], ci[1] - mean], marker="o", capsize=3, label=arm)
    for p in points:
        if p["arm"] == "base":
            for method, splits in p["methods"].items():
                ax.axhline((splits["heldout"].get("without_loops") or {}).get("mean_tpf", np.nan), ls=":",
                           color="gray")
    ax.set_ylabel("held-out TPF, looping answers left out")
    ax_nll.axhline(0.0, ls=":", color="gray")
    ax_nll.set_ylabel("solution NLL minus the base's (95% CI)")
    for a in (ax, ax_nll):
        a.set_xscale("log", base=2)
        a.set_xlabel("training responses")
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    folder = (sys.argv[1:] if argv is None else argv)[0]
    lines = write_curve(folder)
    if lines is None:
        print(f"error: no eval_<arm>_<size>.json in {folder}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
