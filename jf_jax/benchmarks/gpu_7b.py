"""Qwen2.5-7B's shapes on one GPU: AR against the bandwidth bound, the forward-latency knee, lossless decoding at
the fixed decode shape, and the Jacobi Forcing train step's memory and time.

No package here ships 7B weights; speed and memory do not need trained values, so the weights are random
(initialised on the device, not the host) with Qwen2.5-7B's published config (``model.config.QWEN2P5_7B_HF_CONFIG``).
Two processes, so the train step starts with an empty device:

    python experiments/gpu_7b.py decode --out DIR [--budget-s 380]   # writes DIR/decode.json
    python experiments/gpu_7b.py train --out DIR [--budget-s 200]    # writes DIR/train.json
    python experiments/gpu_7b.py decode --config tiny --out /tmp/t   # CPU smoke test (train likewise)

``decode``, in order, each section skipped (and recorded so) when the budget cannot hold it:
(1) device bandwidth (``benchmarks.device.measure_bandwidth``); (2) the model, bf16, random on the device;
(3) AR (compiled driver, natural shapes) at batch 1 and batch ``--ar-batch``, ``--context``-token random prompts,
``--tokens`` new tokens, EOS off, prefill excluded, against the bound bandwidth / (weights + KV read per step);
(4) one cached forward's latency for ``--sizes`` tokens after ``--context`` slots (``tuning.measure_latency``,
interleaved repeats), with each size's compile time; (5) ar, jacobi (n) and mr (n, K, p) at the decode shape that
covers them, tokens compared with AR's; (6) the same jacobi and mr unpadded (their natural forwards' cost).

``report`` (any machine): the tuner's choice from the measured latency curve and a TPF grid, and the tables.
The parts' code: ``gpu_7b_decode``, ``gpu_7b_train``.

``train``: the recipe's loss (configs/recipe.yaml: KL from a frozen bf16 reference, consistency weight 20,
noise-conditioned mask) at bf16 compute, float32 parameters and AdamW state, remat per layer, on synthetic packed
trajectories (``benchmarks.train_step.packed_batches``). Candidates from the recipe's batch down: each is lowered and
compiled ahead of time and its ``memory_analysis()`` read before anything is allocated; the first whose need fits
the device runs ``--steps`` steps (time per step, peak bytes in use, losses). Every number goes to the JSON as it
is measured, so a run stopped by its box keeps what it had.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jf_jax.benchmarks.gpu_7b_decode import decode_main
from jf_jax.benchmarks.gpu_7b_train import train_main

# ------------------------------------------------------------------------------------------------------------
# report (any machine): the tuner's choice from the measured curve, and the tables

PAPER_SWEEP = dict(block_sizes=(16, 32, 64, 128), num_blocks=(1, 2, 3, 4), pool_sizes=(1, 2, 4))


def sections(*paths: Path) -> dict:
    """Every section that has a result, from the decode JSONs in order (a later file fills what an earlier skipped)."""
    out = {}
    for path in paths:
        for name, record in json.loads(path.read_text())["sections"].items():
            if "result" in record and name not in out:
                out[name] = record["result"]
    return out


def report_main(args) -> int:
    from jf_jax.model.config import ModelConfig
    from jf_jax.tuning import roofline, tuner
    from jf_jax.tuning.measure import cells_from_report

    decode_files = [args.out / name for name in ("decode.json", "decode_rest.json") if (args.out / name).exists()]
    found = sections(*decode_files)
    header = json.loads(decode_files[0].read_text())
    cfg = ModelConfig.from_dict(header["config"])
    lat = found["latency"]
    curve = roofline.MeasuredCurve(tuple(lat["tokens"]), tuple(lat["seconds"]))
    grid_report = json.loads(args.tpf_from.read_text())
    cells = cells_from_report(grid_report)
    block_sizes = sorted({c.block_size for c in cells})
    pool_sizes = sorted({c.pool_size for c in cells})
    analysed = tuner.analyse("qwen2.5-7b (random weights)", cfg, curve, cells, block_sizes=block_sizes,
                             pool_sizes=pool_sizes, context=lat["context"], measured_device="H200", dtype="bfloat16")
    tuned = dict(version=1, command=" ".join(sys.argv), model="qwen2.5-7b (random weights)", dtype="bfloat16",
                 grid=dict(grid_report["grid"], tpf_from=str(args.tpf_from)), model_config=cfg.to_dict(), **analysed)
    tuner.write_outputs(tuned, args.out / "tune")
    lines = [f"measured latency (H200, Qwen2.5-7B shapes, bf16, context {lat['context']}; per call):"]
    lines += [f"| {t} | {1e3 * s:.2f} ms | {r:.2f}x |"
              for t, s, r in zip(lat["tokens"], lat["seconds"], lat["relative"])]
    lines.append("forward cost over one token's, per (n, K): K*n tokens; recycling rows p*K*n (measured curve):")
    for n in PAPER_SWEEP["block_sizes"]:
        cells_text = []
        for K in PAPER_SWEEP["num_blocks"]:
            ratios = [float(curve([p * K * n])[0] / curve([1])[0]) for p in PAPER_SWEEP["pool_sizes"]]
            cells_text.append("/".join(f"{r:.2f}" for r in ratios))
        lines.append(f"| n={n} | " + " | ".join(cells_text) + " |")
    lines += tuner.summary_lines(tuned)
    text = "\n".join(lines)
    (args.out / "tables.txt").write_text(text + "\n")
    print(text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("decode", "train", "report"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", choices=("qwen2.5-7b", "tiny"), default="qwen2.5-7b")
    parser.add_argument("--budget-s", type=float, default=380.0, help="seconds this part may take")
    parser.add_argument("--bandwidth-mib", type=int, default=4096)
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens (the cache before decoding)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (EOS off)")
    parser.add_argument("--repeats", type=int, default=3, help="prompts (batches) timed for AR")
    parser.add_argument("--ar-batch", type=int, default=8)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--latency-repeats", type=int, default=10)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--lossless-prompts", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed train steps after the first")
    parser.add_argument("--row-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--train-block", type=int, default=16)
    parser.add_argument("--train-blocks", type=int, default=16)
    parser.add_argument("--train-need-s", type=float, default=60.0, help="budget a train candidate needs to start")
    parser.add_argument("--skip", default="", help="decode: comma list of sections not to run (a rerun's)")
    parser.add_argument("--compile-only", action="store_true",
                        help="train: the recipe's memory analysis only (e.g. XLA:CPU's, as a prediction)")
    parser.add_argument("--tpf-from", type=Path, default=Path("results/studies/tune/tuned.json"),
                        help="report: the TPF grid the tuner's choice uses (TPF does not depend on the hardware)")
    args = parser.parse_args(argv)
    return dict(decode=decode_main, train=train_main, report=report_main)[args.part](args)


if __name__ == "__main__":
    sys.exit(main())
