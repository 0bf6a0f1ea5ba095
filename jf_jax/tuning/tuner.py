"""Hardware-aware configuration of Jacobi / multi-block decoding (paper section 4.3 and its appendix).

Tokens per forward (TPF) depend on the model and the data; the cost of a forward depends on the hardware and
on how many tokens it processes in parallel. The tuner

1. measures (``jf_jax.tuning.measure``) the forward latency of the loaded model on this machine against the
   number of parallel tokens (1 .. 256 tokens in one cached forward, one jit per size, median of several runs):
   the roofline knee;
2. models the latency of A100 / H100 / H200 / B200 analytically (``jf_jax.tuning.roofline``) for the loaded model
   and for Qwen2.5-7B (both in bfloat16);
3. measures (``jf_jax.tuning.measure``) TPF with the real decoder (``generate_mr``: K blocks in flight,
   verification size p) over a grid of block sizes n and verification sizes p on a small prompt set;
4. predicts, per device, tokens/s = TPF / expected forward latency. A forward of the mr decoder processes
   ``K * n`` positions, and ``p * K * n`` on the iterations where recycled candidates were verified
   (the measured fraction ``f`` of iterations); the expected latency is
   ``(1 - f) * latency(K * n) + f * latency(p * K * n)``, i.e. the paper's ``n * p`` when ``K = 1, f = 1``.
   The configuration with the highest predicted tokens/s is chosen per device.

Outputs (``write_outputs``): ``tuned.json`` (device -> block_size, pool_size, num_blocks, predicted tokens/s
and the inputs used), ``latency.png`` and ``tokens_per_second.png`` (``jf_jax.tuning.plots``).

This module takes a loaded model and token-id prompts; the command line (prompt files, chat template, model
loading) is ``jf_jax.cli.tune``, so nothing under ``jf_jax.tuning`` imports ``jf_jax.api`` or a CLI.

    python -m jf_jax.decode --tune [--tune-out DIR]        # the defaults below
    python -m jf_jax.cli.tune --help                       # every knob of the grid
    python -m jf_jax.cli.tune --tpf-from OLD/tuned.json    # re-measure latency only (TPF is hardware-independent)
    python -m jf_jax.decode --methods jacobi,mr --block-size tuned --pool-size tuned

``--block-size tuned`` / ``--pool-size tuned`` read ``tuned.json`` from ``--tune-out`` and take this device's
entry (``current_device()``: "cpu", or the GPU's family name).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jf_jax.decoding.common import prepare_prompts
from jf_jax.tuning import roofline
from jf_jax.tuning.measure import (BLOCK_SIZES, LATENCY_SIZES, NUM_BLOCKS, POOL_SIZES, TUNE_TOKENS, TPFCell,
                                   measure_latency, measure_tpf)
from jf_jax.tuning.plots import plot_latency, plot_surfaces
from jf_jax.weights.store import cache_root

JSON_NAME = "tuned.json"


def default_dir() -> Path:
    """Where the tuner writes and decoding reads when no directory is given: this user's jf-jax cache
    (``$JF_JAX_CACHE/tune``, else ``~/.cache/jf_jax/tune``), never the working directory or the repository."""
    return Path(cache_root()) / "tune"
REFERENCE_MODELS = {"qwen2.5-7b": "QWEN2P5_7B_HF_CONFIG"}


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
        # On a GPU the measured choice keeps the device's own key (decode --block-size tuned reads it there);
        # the model's prediction for that family sits beside it instead of replacing it.
        key = f"{name} (analytic)" if name == measured_device else name
        devices[key] = device_choice(fn, cells, block_sizes, pool_sizes, "analytic")
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
                               "note": "TPF grid borrowed from the loaded model; latency modelled",
                               "devices": per_device}
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


def tune(model, prompts: Sequence[Sequence[int]], *, out_dir: Path | None = None, chat: bool = True,
         latency_sizes: Sequence[int] = LATENCY_SIZES, repeats: int = 5, context: int = 128,
         block_sizes: Sequence[int] = BLOCK_SIZES, pool_sizes: Sequence[int] = POOL_SIZES,
         num_blocks: int = NUM_BLOCKS, spawn_ratio: float = 0.85, max_new_tokens: int = TUNE_TOKENS, seed: int = 0,
         dtype: str = "float32", plots: bool = True, command: str | None = None,
         cells: Sequence[TPFCell] | None = None) -> dict:
    """Measure -> fit -> choose for ``model`` (an ``api.load_model`` result); writes and returns the report.

    ``prompts``: token ids, one list per prompt (``api.encode_prompts``); ``chat`` only records in the report
    whether they went through the chat template. The EOS ids are the model tokenizer's.
    ``cells``: a TPF grid measured before (``cells_from_report``; TPF does not depend on the hardware), so only
    the latency curve is measured again."""
    from tqdm import tqdm

    if isinstance(prompts, str) or any(isinstance(p, str) for p in prompts):
        raise TypeError("tune() takes token-id prompts; encode text with jf_jax.api.encode_prompts")
    if cells is None:  # the TPF grid decodes the prompts: refuse bad ones before measuring anything
        prepare_prompts(model.cfg, prompts, max_new_tokens)
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
        cells = cells or measure_tpf(model.params, model.cfg, prompts, model.tokenizer.eos_ids,
                                     block_sizes=block_sizes, pool_sizes=pool_sizes, num_blocks=num_blocks,
                                     spawn_ratio=spawn_ratio, max_new_tokens=max_new_tokens, seed=seed, progress=bar)
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
    write_outputs(report, default_dir() if out_dir is None else Path(out_dir), plots=plots)
    return report


def write_outputs(report: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """Writes ``tuned.json`` and (unless ``plots`` is False) the two PNGs into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / JSON_NAME]
    paths[0].write_text(json.dumps(report, indent=1, default=float))
    if plots:
        paths += [plot_latency(report, out_dir / "latency.png"),
                  plot_surfaces(report, out_dir / "tokens_per_second.png")]
    return paths



# ----------------------------------------------------------------------------------------------------------
# Reading the result back.

def load_tuned(out_dir: Path | None = None) -> dict:
    out_dir = default_dir() if out_dir is None else Path(out_dir)
    path = out_dir / JSON_NAME
    if not path.is_file():
        raise ValueError(f"no tuned configuration at {path}; run `python -m jf_jax.decode --tune --tune-out {out_dir}`")
    return json.loads(path.read_text())


def tuned_config(out_dir: Path | None = None, device: str | None = None) -> dict:
    """This device's (or ``device``'s) chosen configuration from ``tuned.json`` in ``out_dir`` (default:
    ``default_dir()``)."""
    report = load_tuned(out_dir)
    device = device or current_device()
    if device not in report["devices"]:
        raise ValueError(f"{Path(out_dir or default_dir()) / JSON_NAME} has no entry for device {device!r} "
                         f"(it has {', '.join(report['devices'])})")
    return report["devices"][device]


def resolve_tuned(block_size, pool_size, out_dir: Path | None = None) -> tuple:
    """``(block_size, pool_size)`` with each one given as "tuned" replaced by this device's choice in
    ``out_dir``'s ``tuned.json``; the others are returned as given (nothing is read when neither is "tuned")."""
    if "tuned" not in (block_size, pool_size):
        return block_size, pool_size
    choice = tuned_config(out_dir)
    return tuple(int(choice[name]) if value == "tuned" else value
                 for name, value in (("block_size", block_size), ("pool_size", pool_size)))


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
