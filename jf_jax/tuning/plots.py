"""The tuner's two figures, drawn from a ``tuned.json`` report (``jf_jax.tuning.tuner``): forward latency against
parallel tokens, measured and modelled (``plot_latency``), and the heatmaps of TPF and predicted tokens/s over
block size x verification size with each device's choice boxed (``plot_surfaces``). Matplotlib is imported only
when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jf_jax.tuning import roofline

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
        ax.plot(mt, ms / base * (1 if relative else 1e3), "ko-", lw=2,
                label=f"{meas['device']} measured ({report['model']}, {report['dtype']})")
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
            title += (f"\nbest n={choice['block_size']} p={choice['pool_size']}: "
                      f"{choice['predicted_tokens_per_second']:.1f} tok/s")
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
