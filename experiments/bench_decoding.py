"""ar vs jacobi vs mr on the real SmolLM2-135M-Instruct, in ONE run: with the tuner's configuration for this
device and with the paper's defaults (n=64, K=2, r=0.85, verification size 4).

Every method decodes the same chat prompts one at a time through ``jf_jax.api.generate`` (compiled before the
timed run), prompt-major (each prompt runs every configuration before the next prompt) so that load drift on a
shared machine hits all configurations alike. Tokens/s are reported including and excluding prefill; TPF counts
the prefill as a forward. Every configuration's tokens are compared with AR's, prompt by prompt (lossless).

    python experiments/bench_decoding.py --tokens 64 --out results/studies/decoding_benchmark/decoding_benchmark.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Write a Python function `is_prime(n)` that returns True if n is a prime number.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Give me three tips for staying focused while studying.",
    "Explain in two sentences why the sky is blue.",
]
PAPER = dict(block_size=64, num_blocks=2, spawn_ratio=0.85, pool_size=4)


def configurations(tuned: dict) -> list[tuple[str, str, dict]]:
    n, p = int(tuned["block_size"]), int(tuned["pool_size"])
    return [
        ("ar", "ar", {}),
        (f"jacobi tuned (n={n})", "jacobi", dict(block_size=n)),
        (f"mr tuned (n={n}, K=2, r=0.85, p={p})", "mr",
         dict(block_size=n, num_blocks=2, spawn_ratio=0.85, pool_size=p)),
        ("jacobi paper (n=64)", "jacobi", dict(block_size=64)),
        ("mr paper (n=64, K=2, r=0.85, p=4)", "mr", dict(PAPER)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=3, help=f"how many of the {len(PROMPTS)} built-in prompts")
    ap.add_argument("--tune-dir", type=Path, default=REPO / "results/studies/tune")
    ap.add_argument("--out", type=Path, default=REPO / "results/studies/decoding_benchmark/decoding_benchmark.md")
    ap.add_argument("--json", type=Path, default=REPO / "results/studies/decoding_benchmark/decoding_benchmark.json")
    ap.add_argument("--render-only", action="store_true", help="re-write --out from the saved --json, no decoding")
    args = ap.parse_args(argv)
    if args.render_only:
        from jf_jax.tuning import tuner

        args.out.write_text(markdown(json.loads(args.json.read_text()), tuner.load_tuned(args.tune_dir), args))
        return 0

    from tqdm import tqdm

    from jf_jax import api
    from jf_jax.cli.decode import summarize
    from jf_jax.tuning import tuner

    command = " ".join(["python", "experiments/bench_decoding.py"] + sys.argv[1:])
    tuned_report = tuner.load_tuned(args.tune_dir)
    device = tuner.current_device()
    tuned = tuned_report["devices"][device]
    configs = configurations(tuned)
    prompts = PROMPTS[: args.prompts]
    load_before = os.getloadavg()
    model = api.load_model(args.model)
    runs = []
    start = time.time()
    with tqdm(total=len(prompts) * len(configs), desc="bench", unit="run", file=sys.stderr) as bar:
        for index, prompt in enumerate(prompts):
            for label, method, options in configs:
                bar.set_postfix_str(f"#{index} {label}")
                (c,) = api.generate(model, [prompt], method=method, max_new_tokens=args.tokens, **options)
                runs.append({"method": label, "decoder": method, "options": options, "prompt_index": index,
                             "token_ids": c.token_ids, "new_tokens": c.new_tokens, "forwards": c.forwards,
                             "seconds": c.seconds, "prefill_seconds": c.prefill_seconds, "stats": c.stats})
                bar.update()
    wall = time.time() - start
    load_after = os.getloadavg()
    summary = summarize(runs)
    ar_tokens = {r["prompt_index"]: r["token_ids"] for r in runs if r["method"] == "ar"}
    for label, _, _ in configs:
        summary[label]["lossless"] = all(r["token_ids"] == ar_tokens[r["prompt_index"]]
                                         for r in runs if r["method"] == label)
    report = {"command": command, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                       "load_average_before": load_before, "load_average_after": load_after, "wall_seconds": wall},
              "model": model.name, "tokens": args.tokens, "prompts": prompts, "device": device, "tuned": tuned,
              "summary": summary, "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    args.out.write_text(markdown(report, tuned_report, args))
    print(args.out.read_text())
    lossy = [label for label, s in summary.items() if not s["lossless"]]
    if lossy:
        print(f"NOT LOSSLESS: {lossy}", file=sys.stderr)
        return 1
    return 0


def markdown(report: dict, tuned_report: dict, args) -> str:
    from jf_jax.eval.stats_table import Column, render_table
    from jf_jax.tuning import tuner

    # A report saved before decoding.stats named TPF ``tpf`` holds it as ``tokens_per_forward`` (--render-only).
    s = {label: {"tpf": v.get("tokens_per_forward"), **v} for label, v in report["summary"].items()}
    rel = lambda p: os.path.relpath(p, args.out.parent)  # noqa: E731
    h = report["host"]
    lines = [
        "# Decoding benchmark: ar vs jacobi vs mr on SmolLM2-135M-Instruct (untrained for Jacobi)",
        "",
        f"- Date: {report['date']}; host: {h['platform']}, {h['cpu_count']} CPUs (shared with other processes).",
        f"- Load average (1/5/15 min) before: {', '.join(f'{x:.2f}' for x in h['load_average_before'])}; "
        f"after: {', '.join(f'{x:.2f}' for x in h['load_average_after'])}; wall time {h['wall_seconds']:.0f} s.",
        f"- Command: `{report['command']}`",
        f"- {len(report['prompts'])} chat prompts x up to {report['tokens']} new tokens (greedy, float32, batch 1, "
        "EOS stops), one run, prompt-major order; each configuration compiled before its timed run.",
        "",
        render_table([dict(v, configuration=label, equal="yes" if v["lossless"] else "NO") for label, v in s.items()],
                     ["configuration", "tpf", "tokens_per_second", "tokens_per_second_excl_prefill", "speedup_vs_ar",
                      "speedup_vs_ar_excl_prefill", "tokens", "forwards", Column("equal", "tokens == ar")]),
    ]
    mr_stats = {k: v for k, v in s.items() if k.startswith("mr")}
    lines += ["", "mr statistics: " + "; ".join(
        f"{k}: recycling rounds {v.get('recycling_rounds', 0)}, wins {v.get('recycling_wins', 0)}, spawns "
        f"{v.get('spawns', 0)}, promotions {v.get('promotions', 0)} (carried {v.get('promotions_carried', 0)})"
        for k, v in mr_stats.items()), ""]
    t = report["tuned"]
    meas = tuned_report["latency"]["measured"]
    tuned_jacobi = next(v for k, v in s.items() if k.startswith("jacobi tuned"))
    lines += [
        "Reading: the Jacobi methods run the *untrained* SmolLM2 (TPF near 1, as the paper's plain-Jacobi row), so "
        "on this CPU every parallel forward is pure extra cost: a forward of n tokens costs several times a "
        "1-token step here (XLA:CPU's small-M matmuls do not stay memory-bound), and no configuration beats AR. "
        f"The tuner predicted {t['predicted_tokens_per_second']:.1f} tok/s for its choice (excl. prefill) and "
        f"jacobi measured {tuned_jacobi['tokens_per_second_excl_prefill']:.1f}; "
        f"its pick is {tuned_jacobi['speedup_vs_ar']:.2f}x "
        f"AR against {s['mr paper (n=64, K=2, r=0.85, p=4)']['speedup_vs_ar']:.2f}x for the paper's GPU defaults. "
        "The mr rows use K=2 (the paper's) with the tuned n and p; the tuner's grid itself ran K=1 "
        "(Jacobi + recycling, parallel tokens n x p). Recycling raises TPF even on the untrained model "
        "(prompt-lookup-like candidates), which the GPU choices exploit below their roofline knee.",
        "",
    ]
    lines += [
        f"## The tuner's configuration ({report['device']})",
        "",
        f"From `{rel(args.tune_dir / 'tuned.json')}` (made by `{tuned_report.get('command')}` on "
        f"{tuned_report['created']}): block size **{t['block_size']}**, verification size **{t['pool_size']}** "
        f"(grid K={t['num_blocks']}), predicted {t['predicted_tokens_per_second']:.1f} tok/s vs predicted AR "
        f"{t['predicted_ar_tokens_per_second']:.1f} tok/s (TPF {t['tpf']:.3f}).",
        "",
        "Measured forward latency against parallel tokens on this machine (median; relative to 1 token): " + ", ".join(
            f"{tk}: {sec * 1e3:.0f} ms ({r:.2f}x)" for tk, sec, r in
            zip(meas["tokens"], meas["seconds"], meas["relative_to_1_token"])) + ".",
        "",
        "| device | block size | verification size | TPF | predicted tok/s | predicted AR tok/s | latency model |",
        "|---|---|---|---|---|---|---|",
    ]
    for model_name, d, c in tuner.chosen_configs(tuned_report):
        lines.append(f"| {d} ({model_name}) | {c['block_size']} | {c['pool_size']} | {c['tpf']:.3f} | "
                     f"{c['predicted_tokens_per_second']:.1f} | {c['predicted_ar_tokens_per_second']:.1f} | "
                     f"{c['latency_model']} |")
    lines += [
        "",
        f"Plots: [latency vs parallel tokens]({rel(args.tune_dir / 'latency.png')}), "
        f"[predicted tokens/s over block size x verification size]({rel(args.tune_dir / 'tokens_per_second.png')}).",
        "",
        "![latency](" + rel(args.tune_dir / "latency.png") + ")",
        "",
        "![tokens/s](" + rel(args.tune_dir / "tokens_per_second.png") + ")",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
