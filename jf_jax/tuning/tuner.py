"""Hardware-aware configuration of Jacobi / multi-block decoding (paper section 4.3 and its appendix).

Tokens per forward (TPF) depend on the model and the data; the cost of a forward depends on the hardware and
on how many tokens it processes in parallel. The tuner

1. measures the forward latency of the loaded model on this machine against the number of parallel tokens
   (1 .. 128 tokens in one cached forward, one jit per size, median of several runs): the roofline knee;
2. models the latency of A100 / H100 / H200 / B200 analytically (``jf_jax.tuning.roofline``) for the loaded model and
   for Qwen2.5-7B (both in bfloat16);
3. measures TPF with the real decoder (``generate_mr``: K blocks in flight, verification size p) over a grid of
   block sizes n and verification sizes p on a small prompt set;
4. predicts, per device, tokens/s = TPF / expected forward latency. A forward of the mr decoder processes
   ``K * n`` positions, and ``p * K * n`` on the iterations where recycled candidates were verified
   (the measured fraction ``f`` of iterations); the expected latency is
   ``(1 - f) * latency(K * n) + f * latency(p * K * n)``, i.e. the paper's ``n * p`` when ``K = 1, f = 1``.
   The configuration with the highest predicted tokens/s is chosen per device.

Outputs (``write_outputs``): ``tuned.json`` (device -> block_size, pool_size, num_blocks, predicted tokens/s
and the inputs used), ``latency.png`` and ``tokens_per_second.png``.

    python -m jf_jax.decode --tune [--tune-out DIR]     # the defaults below
    python -m jf_jax.tuning.tuner --help                       # every knob of the grid
    python -m jf_jax.tuning.tuner --tpf-from OLD/tuned.json    # re-measure latency only (TPF is hardware-independent)
    python -m jf_jax.decode --methods jacobi,mr --block-size tuned --pool-size tuned

``--block-size tuned`` / ``--pool-size tuned`` read ``tuned.json`` from ``--tune-out`` and take this device's
entry (``current_device()``: "cpu", or the GPU's family name).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jf_jax.tuning import roofline

DEFAULT_DIR = Path("experiments/results/tune")
JSON_NAME = "tuned.json"
LATENCY_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCK_SIZES = (4, 8, 16, 32, 64)
POOL_SIZES = (1, 2, 4)
TUNE_TOKENS = 32  # 3 prompts x 32 tokens: the grid runs ~1300 forwards on a 2-core CPU
TUNE_PROMPTS = 3
NUM_BLOCKS = 1  # K of the grid: 1 = Jacobi with recycling (parallel tokens n * p); the paper fixes K=2 first
REFERENCE_MODELS = {"qwen2.5-7b": "QWEN2P5_7B_HF_CONFIG"}


# ----------------------------------------------------------------------------------------------------------
# Measurements.

def measure_latency(params, cfg, sizes: Sequence[int] = LATENCY_SIZES, *, context: int = 128, repeats: int = 5,
                    progress=None) -> roofline.MeasuredCurve:
    """Median seconds of one cached forward (+ float32 logits and argmax, as the decoders do) of ``t`` tokens
    over ``context`` committed slots, for each ``t`` in ``sizes`` (one compiled program per size)."""
    import jax
    import jax.numpy as jnp

    from jf_jax.decoding.common import greedy
    from jf_jax.model.kv_cache import KVCache
    from jf_jax.model.transformer import forward, logits
    from jf_jax.model.decode_view import decode_view

    params = decode_view(params)

    @jax.jit
    def step(params, tokens, cache):
        hidden, cache = forward(params, cfg, tokens, cache=cache)
        return greedy(logits(params, cfg, hidden)), cache

    medians = []
    for t in sizes:
        if progress is not None:
            progress.set_postfix_str(f"latency t={t}")
        cache = KVCache.init(cfg, 1, context + t).with_lengths(context)
        tokens = (jnp.arange(t, dtype=jnp.int32) * 7919 % cfg.vocab_size)[None]
        jax.block_until_ready(step(params, tokens, cache))  # compile + warm up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(step(params, tokens, cache))
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
        if progress is not None:
            progress.update()
    return roofline.MeasuredCurve(tuple(int(t) for t in sizes), tuple(medians))


@dataclasses.dataclass(frozen=True)
class TPFCell:
    """TPF of one (block size, verification size) setting of the mr decoder over the prompt set."""

    block_size: int
    pool_size: int
    num_blocks: int
    tokens: int
    forwards: int  # prefill included
    recycling_rounds: int  # iterations that verified recycled candidate rows
    lossless: bool  # tokens equal to the grid's first setting's tokens, prompt by prompt

    @property
    def tpf(self) -> float:
        return self.tokens / max(self.forwards, 1)

    @property
    def recycle_fraction(self) -> float:
        return self.recycling_rounds / max(self.forwards, 1)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "tpf": self.tpf, "recycle_fraction": self.recycle_fraction}


def measure_tpf(params, cfg, prompts: Sequence[Sequence[int]], eos_ids: Sequence[int], *,
                block_sizes: Sequence[int] = BLOCK_SIZES, pool_sizes: Sequence[int] = POOL_SIZES,
                num_blocks: int = NUM_BLOCKS, spawn_ratio: float = 0.85, max_new_tokens: int = TUNE_TOKENS, seed: int = 0,
                progress=None) -> list[TPFCell]:
    """Runs ``generate_mr`` for every (n, p) of the grid on token-id ``prompts``; TPF from its statistics."""
    from jf_jax.decoding.multiblock import generate_mr

    cells, reference = [], None
    for n in block_sizes:
        for p in pool_sizes:
            if progress is not None:
                progress.set_postfix_str(f"TPF n={n} p={p}")
            result = generate_mr(params, cfg, list(prompts), max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                                 block_size=n, num_blocks=num_blocks, spawn_ratio=spawn_ratio, pool_size=p,
                                 seed=seed, warmup=False)
            total = result.stats["total"]
            reference = result.token_ids if reference is None else reference
            cells.append(TPFCell(block_size=n, pool_size=p, num_blocks=num_blocks, tokens=int(total["tokens"]),
                                 forwards=int(total["forwards"]), recycling_rounds=int(total["recycling_rounds"]),
                                 lossless=result.token_ids == reference))
            if progress is not None:
                progress.update()
    return cells


# ----------------------------------------------------------------------------------------------------------
# Prediction and choice.

def expected_latency(latency_fn, cell: TPFCell) -> float:
    """Mean seconds per forward of ``cell``'s decoder: K*n positions, p*K*n on recycling iterations."""
    width = cell.num_blocks * cell.block_size
    f = cell.recycle_fraction if cell.pool_size > 1 else 0.0
    one, many = (float(x) for x in latency_fn([width, cell.pool_size * width]))
    return (1 - f) * one + f * many


def predict_surface(latency_fn, cells: Sequence[TPFCell], block_sizes, pool_sizes) -> np.ndarray:
    """Predicted tokens/s [len(block_sizes), len(pool_sizes)] (NaN where the grid has no cell)."""
    surface = np.full((len(block_sizes), len(pool_sizes)), np.nan)
    for c in cells:
        surface[list(block_sizes).index(c.block_size), list(pool_sizes).index(c.pool_size)] = (
            c.tpf / expected_latency(latency_fn, c))
    return surface


def choose(surface: np.ndarray, block_sizes, pool_sizes) -> tuple[int, int]:
    """(block_size, pool_size) at the argmax of the predicted tokens/s surface (first in grid order on ties)."""
    i, j = np.unravel_index(np.nanargmax(surface), surface.shape)
    return int(block_sizes[i]), int(pool_sizes[j])


def device_choice(latency_fn, cells, block_sizes, pool_sizes, latency_model: str) -> dict:
    surface = predict_surface(latency_fn, cells, block_sizes, pool_sizes)
    n, p = choose(surface, block_sizes, pool_sizes)
    cell = next(c for c in cells if (c.block_size, c.pool_size) == (n, p))
    width = cell.num_blocks * n
    return {"block_size": n, "pool_size": p, "num_blocks": cell.num_blocks,
            "predicted_tokens_per_second": float(np.nanmax(surface)),
            "predicted_ar_tokens_per_second": float(1.0 / float(latency_fn([1])[0])),
            "tpf": cell.tpf, "recycle_fraction": cell.recycle_fraction,
            "parallel_tokens": [width, p * width], "expected_forward_seconds": expected_latency(latency_fn, cell),
            "latency_model": latency_model, "surface": surface.tolist()}


# ----------------------------------------------------------------------------------------------------------
# The whole pipeline.

def current_device() -> str | None:
    """The key of this machine in ``tuned.json``: "cpu", a GPU family in ``roofline.GPUS``, or None."""
    import jax

    if jax.default_backend() == "cpu":
        return "cpu"
    kind = jax.devices()[0].device_kind.upper()
    return next((name for name in roofline.GPUS if name in kind), None)


def analyse(model_name: str, cfg, curve: roofline.MeasuredCurve, cells: Sequence[TPFCell], *, block_sizes,
            pool_sizes, context: int, measured_device: str = "cpu", dtype: str = "float32") -> dict:
    """Latency models + predicted surfaces + per-device choices, as the JSON-ready report (without settings)."""
    from jf_jax.model.config import QWEN2P5_7B_HF_CONFIG, from_hf_config

    cost = roofline.ModelCost.from_config(cfg, model_name)
    fit = curve.fitted_roofline(cost, dtype)
    fit_device = fit.pop("device")
    devices = {measured_device: device_choice(curve, cells, block_sizes, pool_sizes, "measured")}
    analytic = {}
    for name, dev in roofline.GPUS.items():
        fn = lambda t, dev=dev: roofline.latency(cost, dev, t, context)  # noqa: E731
        devices[name] = device_choice(fn, cells, block_sizes, pool_sizes, "analytic")
        analytic[name] = {"bandwidth_tb_s": dev.bandwidth / 1e12, "peak_tflop_s": dev.peak_flops / 1e12,
                          "overhead_s": dev.overhead_s, "dtype": dev.dtype, "ridge_flop_per_byte": dev.ridge,
                          "knee_tokens": roofline.knee(cost, dev, context),
                          "streamed_weight_bytes": cost.weight_bytes(dev.dtype)}
    reference = {}
    for ref_name in REFERENCE_MODELS:
        ref_cost = roofline.ModelCost.from_config(from_hf_config(QWEN2P5_7B_HF_CONFIG), ref_name)
        per_device = {}
        for name, dev in roofline.GPUS.items():
            fn = lambda t, dev=dev: roofline.latency(ref_cost, dev, t, context)  # noqa: E731
            per_device[name] = device_choice(fn, cells, block_sizes, pool_sizes, "analytic")
            per_device[name]["knee_tokens"] = roofline.knee(ref_cost, dev, context)
        reference[ref_name] = {"streamed_weight_bytes_bf16": ref_cost.weight_bytes("bfloat16"),
                               "note": "TPF grid borrowed from the loaded model; latency modelled", "devices": per_device}
    return {
        "latency": {
            "measured": {"device": measured_device, "tokens": list(curve.tokens), "seconds": list(curve.seconds),
                         "context": context, "relative_to_1_token": [s / curve.seconds[0] for s in curve.seconds],
                         "knee_tokens_1p5x": roofline.measured_knee(curve), "fitted_roofline": fit,
                         "streamed_weight_bytes": cost.weight_bytes(dtype), "fit_knee_device": fit_device.name},
            "analytic": analytic,
        },
        "tpf": [c.to_json() for c in cells],
        "devices": devices,
        "reference_models": reference,
    }


def tune(model, prompts: Sequence[str], *, out_dir: Path = DEFAULT_DIR, chat: bool = True,
         latency_sizes: Sequence[int] = LATENCY_SIZES, repeats: int = 5, context: int = 128,
         block_sizes: Sequence[int] = BLOCK_SIZES, pool_sizes: Sequence[int] = POOL_SIZES, num_blocks: int = NUM_BLOCKS,
         spawn_ratio: float = 0.85, max_new_tokens: int = TUNE_TOKENS, seed: int = 0, dtype: str = "float32",
         plots: bool = True, command: str | None = None, cells: Sequence[TPFCell] | None = None) -> dict:
    """Measure -> fit -> choose for ``model`` (an ``api.load_model`` result); writes and returns the report.

    ``cells``: a TPF grid measured before (``cells_from_report``; TPF does not depend on the hardware), so only
    the latency curve is measured again."""
    from tqdm import tqdm

    from jf_jax.api import encode_prompts

    encoded = encode_prompts(model, prompts, chat)
    device = current_device() or "this-device"
    start = time.perf_counter()
    if cells is not None:
        block_sizes = sorted({c.block_size for c in cells})
        pool_sizes = sorted({c.pool_size for c in cells})
        num_blocks = cells[0].num_blocks
    with tqdm(total=len(latency_sizes) + (0 if cells else len(block_sizes) * len(pool_sizes)), desc="tuning",
              unit="step", file=sys.stderr) as bar:
        curve = measure_latency(model.params, model.cfg, latency_sizes, context=context, repeats=repeats,
                                progress=bar)
        cells = cells or measure_tpf(model.params, model.cfg, encoded, model.tokenizer.eos_ids, block_sizes=block_sizes,
                            pool_sizes=pool_sizes, num_blocks=num_blocks, spawn_ratio=spawn_ratio,
                            max_new_tokens=max_new_tokens, seed=seed, progress=bar)
    report = {
        "version": 1,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": command,
        "model": getattr(model, "name", "model"),
        "dtype": dtype,
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                 "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                 "measure_seconds": time.perf_counter() - start},
        "grid": {"block_sizes": list(block_sizes), "pool_sizes": list(pool_sizes), "num_blocks": num_blocks,
                 "spawn_ratio": spawn_ratio, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
                 "seed": seed, "chat": chat, "latency_repeats": repeats},
        "model_config": model.cfg.to_dict(),
        **analyse(getattr(model, "name", "model"), model.cfg, curve, cells, block_sizes=block_sizes,
                  pool_sizes=pool_sizes, context=context, measured_device=device, dtype=dtype),
    }
    write_outputs(report, Path(out_dir), plots=plots)
    return report


def cells_from_report(report: dict) -> list[TPFCell]:
    """The TPF grid of an earlier report (``tuned.json``)."""
    names = {f.name for f in dataclasses.fields(TPFCell)}
    return [TPFCell(**{k: v for k, v in c.items() if k in names}) for c in report["tpf"]]


def write_outputs(report: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / JSON_NAME]
    paths[0].write_text(json.dumps(report, indent=1, default=float))
    if plots:
        paths += [plot_latency(report, out_dir / "latency.png"), plot_surfaces(report, out_dir / "tokens_per_second.png")]
    return paths


# ----------------------------------------------------------------------------------------------------------
# Plots.

GPU_COLORS = {"A100": "tab:blue", "H100": "tab:orange", "H200": "tab:green", "B200": "tab:red"}


def plot_latency(report: dict, path: Path) -> Path:
    """Log-log latency against parallel tokens: measured (this machine) and modelled GPUs; absolute and relative."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jf_jax.model.config import QWEN2P5_7B_HF_CONFIG, ModelConfig, from_hf_config

    meas = report["latency"]["measured"]
    context = meas["context"]
    t = np.unique(np.geomspace(1, 2048, 200).round())
    cfg = ModelConfig.from_dict(report["model_config"]) if "model_config" in report else None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    costs = {}
    if cfg is not None:
        costs[report["model"]] = (roofline.ModelCost.from_config(cfg, report["model"]), "-")
    costs["qwen2.5-7b"] = (roofline.ModelCost.from_config(from_hf_config(QWEN2P5_7B_HF_CONFIG), "qwen2.5-7b"), "--")
    for ax, relative in zip(axes, (False, True)):
        mt, ms = np.array(meas["tokens"]), np.array(meas["seconds"])
        base = ms[0] if relative else 1.0
        ax.plot(mt, ms / base * (1 if relative else 1e3), "ko-", lw=2, label=f"{meas['device']} measured ({report['model']}, {report['dtype']})")
        fit = report["latency"]["measured"]["fitted_roofline"]
        if cfg is not None:
            dev = roofline.Device("fit", fit["effective_bandwidth_gb_s"] * 1e9, fit["effective_peak_gflop_s"] * 1e9,
                                  dtype=report["dtype"])
            fitted = roofline.latency(costs[report["model"]][0], dev, t, context)
            ax.plot(t, fitted / (fitted[0] if relative else 1e-3), "k:", lw=1,
                    label=f"{meas['device']} fitted roofline (knee ~{fit['knee_tokens']:.0f})")
        for model_name, (cost, style) in costs.items():
            for name, dev in roofline.GPUS.items():
                lat = roofline.latency(cost, dev, t, context)
                k = roofline.knee(cost, dev, context)
                label = f"{name} {model_name} (knee {k:.0f})"
                ax.plot(t, lat / (lat[0] if relative else 1e-3), style, color=GPU_COLORS[name], label=label)
                if relative:
                    ax.axvline(k, color=GPU_COLORS[name], lw=0.5, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("parallel tokens in one forward")
        ax.set_ylabel("latency relative to 1 token" if relative else "forward latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title("relative latency: the roofline knee" if relative else "forward latency")
    axes[1].legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="upper left", framealpha=0.9)
    fig.suptitle(f"Forward latency vs parallel tokens (context {context}; GPUs: bf16 analytic roofline + "
                 f"{roofline.GPU_OVERHEAD_S * 1e3:.1f} ms overhead)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_surfaces(report: dict, path: Path) -> Path:
    """Heatmaps over (block size, verification size): TPF, then predicted tokens/s per device (chosen cell boxed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    grid = report["grid"]
    ns, ps = grid["block_sizes"], grid["pool_sizes"]
    tpf = np.full((len(ns), len(ps)), np.nan)
    for c in report["tpf"]:
        tpf[ns.index(c["block_size"]), ps.index(c["pool_size"])] = c["tpf"]
    rows = [("TPF (measured)", tpf, None)] + [
        (f"{d}: {report['model']}", np.array(v["surface"], float), v) for d, v in report["devices"].items()]
    for ref, data in report["reference_models"].items():
        rows += [(f"{d}: {ref}", np.array(v["surface"], float), v) for d, v in data["devices"].items()]
    cols = 5
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.3 * cols, 3.0 * nrows), squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.axis("off")
    for ax, (title, data, choice) in zip(axes.flat, rows):
        im = ax.imshow(data, origin="lower", aspect="auto", cmap="viridis")
        fmt = "{:.2f}" if choice is None else ("{:.0f}" if np.nanmax(data) >= 100 else "{:.1f}")
        for i in range(len(ns)):
            for j in range(len(ps)):
                if np.isfinite(data[i, j]):
                    ax.text(j, i, fmt.format(data[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if data[i, j] < np.nanmean(data) else "black")
        if choice is not None:
            i, j = ns.index(choice["block_size"]), ps.index(choice["pool_size"])
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2.5))
            title += f"\nbest n={choice['block_size']} p={choice['pool_size']}: {choice['predicted_tokens_per_second']:.1f} tok/s"
        ax.set_xticks(range(len(ps)), [str(p) for p in ps])
        ax.set_yticks(range(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("verification size p")
        ax.set_ylabel("block size n")
        ax.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"Predicted tokens/s = TPF / expected forward latency (mr, K={grid['num_blocks']}, "
                 f"r={grid['spawn_ratio']}; {grid['prompts']} prompts x {grid['max_new_tokens']} tokens)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------------
# Reading the result back, and the command lines.

def load_tuned(out_dir: Path = DEFAULT_DIR) -> dict:
    path = Path(out_dir) / JSON_NAME
    if not path.is_file():
        raise ValueError(f"no tuned configuration at {path}; run `python -m jf_jax.decode --tune --tune-out {out_dir}`")
    return json.loads(path.read_text())


def tuned_config(out_dir: Path = DEFAULT_DIR, device: str | None = None) -> dict:
    """This device's (or ``device``'s) chosen configuration from ``tuned.json``."""
    report = load_tuned(out_dir)
    device = device or current_device()
    if device not in report["devices"]:
        raise ValueError(f"{Path(out_dir) / JSON_NAME} has no entry for device {device!r} "
                         f"(it has {', '.join(report['devices'])})")
    return report["devices"][device]


def apply_tuned(args) -> None:
    """Replaces ``--block-size tuned`` / ``--pool-size tuned`` on a decode.py namespace by this device's choice."""
    if "tuned" not in (getattr(args, "block_size", None), getattr(args, "pool_size", None)):
        return
    choice = tuned_config(getattr(args, "tune_out", None) or DEFAULT_DIR)
    for name in ("block_size", "pool_size"):
        if getattr(args, name, None) == "tuned":
            setattr(args, name, int(choice[name]))
    print(f"tuned configuration: block size {args.block_size}, pool size {args.pool_size}", file=sys.stderr)


def int_or_tuned(text: str):
    """argparse type: a positive integer or the word "tuned"."""
    if text == "tuned":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'tuned', got {text!r}") from None


def chosen_configs(report: dict):
    """(model name, device, chosen configuration) of the tuned model and then of each reference model."""
    for model_name, devices in [(report["model"], report["devices"])] + [
            (k, v["devices"]) for k, v in report["reference_models"].items()]:
        for device, config in devices.items():
            yield model_name, device, config


def summary_lines(report: dict) -> list[str]:
    meas = report["latency"]["measured"]
    lines = [f"measured forward latency ({meas['device']}, {report['model']}, context {meas['context']}):"]
    lines += [f"  {t:>4} tokens: {s * 1e3:8.2f} ms  ({r:.2f}x)" for t, s, r in
              zip(meas["tokens"], meas["seconds"], meas["relative_to_1_token"])]
    lines.append("chosen configuration per device (predicted tokens/s excludes prefill):")
    for model_name, d, c in chosen_configs(report):
        lines.append(f"  {model_name:>14} {d:>5}: n={c['block_size']:<3} p={c['pool_size']} K={c['num_blocks']} "
                     f"TPF {c['tpf']:.3f}  {c['predicted_tokens_per_second']:9.1f} tok/s "
                     f"(AR {c['predicted_ar_tokens_per_second']:.1f}; {c['latency_model']})")
    return lines


def run_from_args(args, prompts: Sequence[str], command: str | None = None) -> dict:
    from jf_jax import api

    print(f"loading {args.model} ({args.dtype}) ...", file=sys.stderr)
    model = api.load_model(args.model, dtype=args.dtype)
    opts = dict(out_dir=Path(getattr(args, "tune_out", None) or DEFAULT_DIR), chat=not args.no_chat,
                dtype=args.dtype, command=command or " ".join(["python -m jf_jax.tuning.tuner"] + sys.argv[1:]))
    for name in ("latency_sizes", "repeats", "context", "block_sizes", "pool_sizes", "max_new_tokens"):
        if getattr(args, name, None) is not None:
            opts[name] = getattr(args, name)
    for name in ("num_blocks", "spawn_ratio", "seed"):
        if getattr(args, name, None) is not None:
            opts[name] = getattr(args, name)
    if getattr(args, "tpf_from", None) is not None:
        earlier = json.loads(Path(args.tpf_from).read_text())
        opts["cells"] = cells_from_report(earlier)
        opts.update({k: earlier["grid"][k] for k in ("spawn_ratio", "max_new_tokens", "seed", "chat")
                     if k in earlier["grid"] and k != "chat"})
    report = tune(model, prompts, **opts)
    print("\n".join(summary_lines(report)))
    print(f"wrote {opts['out_dir'] / JSON_NAME}, latency.png, tokens_per_second.png", file=sys.stderr)
    return report


def decode_cli(args) -> int:
    """``python -m jf_jax.decode --tune``: the tuner with its own grid defaults and decode.py's model options."""
    from jf_jax.decode import read_prompts

    prompts = read_prompts(args)[:TUNE_PROMPTS] if not (args.prompt or args.prompts) else read_prompts(args)
    args.max_new_tokens = getattr(args, "tune_tokens", None) or TUNE_TOKENS
    run_from_args(args, prompts, command=" ".join(["python -m jf_jax.decode"] + sys.argv[1:]))
    return 0


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jf_jax.tuning.tuner", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--prompt", action="append", default=[])
    p.add_argument("--prompts", type=Path)
    p.add_argument("--no-chat", action="store_true")
    p.add_argument("--tune-out", type=Path, default=DEFAULT_DIR)
    p.add_argument("--latency-sizes", type=_ints, default=LATENCY_SIZES)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--context", type=int, default=128, help="committed KV slots of the latency measurement")
    p.add_argument("--block-sizes", type=_ints, default=BLOCK_SIZES)
    p.add_argument("--pool-sizes", type=_ints, default=POOL_SIZES)
    p.add_argument("--num-blocks", type=int, default=NUM_BLOCKS, help="K of the grid (1: Jacobi + recycling)")
    p.add_argument("--spawn-ratio", type=float, default=0.85)
    p.add_argument("--max-new-tokens", type=int, default=TUNE_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tpf-from", type=Path, help="reuse the TPF grid of this tuned.json; only re-measure latency")
    args = p.parse_args(argv)
    from jf_jax.decode import read_prompts

    prompts = read_prompts(args)[:TUNE_PROMPTS] if not (args.prompt or args.prompts) else read_prompts(args)
    run_from_args(args, prompts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
