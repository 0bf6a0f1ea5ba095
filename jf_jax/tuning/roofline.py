"""Forward latency against the number of parallel tokens: an analytic roofline for GPUs, a measured curve for
the machine at hand (docs/method.md, section 7).

One forward of ``t`` tokens (over ``context`` committed KV slots) streams the weights once and does about
``2 * t`` FLOPs per streamed weight plus attention::

    latency(t) = overhead + max(bytes(t) / bandwidth, flops(t) / peak)
    bytes(t)   = streamed weight bytes + KV-cache bytes read (context slots) + KV bytes written (t slots)
    flops(t)   = 2 * t * streamed params + 4 * t * (context + t / 2) * layers * heads * head_dim

"Streamed" weights are every parameter except an untied input-embedding table (only ``t`` of its rows are
gathered); with tied embeddings the table is read in full as the lm_head. For Qwen2.5-7B in bfloat16 that is
~14.1 GB per forward (tests/test_tuner.py checks it). Without attention and KV traffic, and with 2-byte weights,
the knee (memory time == compute time) sits at ``t = peak / bandwidth``, the device's ridge point.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from jf_jax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Device:
    """A device of the analytic model: HBM bandwidth and dense bf16 tensor peak (vendor datasheet figures); the
    accelerators of ``TARGETS`` also carry their HBM capacity and chip-to-chip link rate (``jf_jax.tuning.plan``)."""

    name: str
    bandwidth: float  # bytes / s
    peak_flops: float  # FLOP / s, dense bfloat16
    overhead_s: float = 0.0  # fixed cost per forward (kernel launches, host), seconds
    dtype: str = "bfloat16"  # weight / KV dtype the device runs the model in
    hbm_bytes: float = 0.0  # memory per chip, bytes (0: unknown)
    link_bandwidth: float = 0.0  # chip-to-chip, one direction, bytes / s (0: unknown)
    source: str = ""  # where the figures come from

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which compute and memory time are equal (= knee in tokens for 2-byte weights)."""
        return self.peak_flops / self.bandwidth


# Per-forward overhead: ~30 kernel launches per layer at a few microseconds each is ~0.1 ms for a 28-30 layer
# model without CUDA graphs; an assumption, not a measurement (recorded in the tuner's JSON).
GPU_OVERHEAD_S = 1e-4

GIB = 2**30
NVIDIA_GB = GIB
"""NVIDIA's "GB" of HBM are binary: an H200 sold as 141 GB reports 143,771 MiB = 140.4 GiB
(results/studies/gpu_h200_7b/nvidia_smi.txt), an 80 GB H100 81,559 MiB."""

GPUS: dict[str, Device] = {
    # Datasheet figures (dense bf16: the sheets' "with sparsity" numbers halved; NVLink: the sheets' per-GPU total
    # of both directions, halved): A100-80GB SXM 2.039 TB/s, 312 TFLOP/s, NVLink 600 GB/s, ridge ~150;
    # H100 SXM 3.35 TB/s, 989, NVLink 900, ridge ~295; H200 SXM 4.8 TB/s, 989, NVLink 900, ridge ~206;
    # B200 (HGX B200: 1,440 GB and 64 TB/s over 8 GPUs, 36 PFLOP/s sparse bf16) 8.0 TB/s, 2,250, NVLink 1.8 TB/s.
    "A100": Device("A100", bandwidth=2.039e12, peak_flops=312e12, overhead_s=GPU_OVERHEAD_S, hbm_bytes=80 * NVIDIA_GB,
                   link_bandwidth=300e9, source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    "H100": Device("H100", bandwidth=3.35e12, peak_flops=989e12, overhead_s=GPU_OVERHEAD_S, hbm_bytes=80 * NVIDIA_GB,
                   link_bandwidth=450e9, source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
    "H200": Device("H200", bandwidth=4.8e12, peak_flops=989e12, overhead_s=GPU_OVERHEAD_S, hbm_bytes=141 * NVIDIA_GB,
                   link_bandwidth=450e9, source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    "B200": Device("B200", bandwidth=8.0e12, peak_flops=2250e12, overhead_s=GPU_OVERHEAD_S,
                   hbm_bytes=180 * NVIDIA_GB, link_bandwidth=900e9, source="NVIDIA HGX B200 datasheet, per GPU"),
}

TPUS: dict[str, Device] = {
    # Google Cloud TPU documentation, per chip ("System architecture" pages of v5e, v5p, v6e): HBM in GiB, HBM
    # bandwidth, peak bf16 compute, and the interchip interconnect (ICI) rate in Gbps, halved for one direction.
    "v5e": Device("TPU v5e", bandwidth=819e9, peak_flops=197e12, hbm_bytes=16 * GIB, link_bandwidth=1600e9 / 8 / 2,
                  source="cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GiB HBM2, 819 GB/s, ICI 1,600 Gbps"),
    "v5p": Device("TPU v5p", bandwidth=2765e9, peak_flops=459e12, hbm_bytes=95 * GIB, link_bandwidth=4800e9 / 8 / 2,
                  source="cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB HBM2e, 2,765 GB/s, ICI 4,800 Gbps"),
    "v6e": Device("TPU v6e", bandwidth=1640e9, peak_flops=918e12, hbm_bytes=32 * GIB, link_bandwidth=3584e9 / 8 / 2,
                  source="cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GiB HBM, 1,640 GB/s, ICI 3,584 Gbps"),
}

TARGETS: dict[str, Device] = {**TPUS, "a100-80gb": GPUS["A100"], "h100": GPUS["H100"], "h200": GPUS["H200"],
                              "b200": GPUS["B200"]}
"""The accelerators ``jf-jax plan --target`` knows, by the name it takes."""

# A rough figure for 2-core x86 dev machines, float32 (used for the "nominal" CPU roofline line only; the
# tuner uses the measured curve for the CPU).
CPU_NOMINAL = Device("cpu (nominal)", bandwidth=15e9, peak_flops=260e9, dtype="float32")

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """What one forward of a model costs, independent of the device (per-token and fixed parts)."""

    name: str
    streamed_params: int  # parameters read in full by every forward
    num_layers: int
    kv_width: int  # num_kv_heads * head_dim
    attn_width: int  # num_heads * head_dim

    @classmethod
    def from_config(cls, cfg: ModelConfig, name: str = "model") -> "ModelCost":
        from jf_jax.model.params import abstract_params, count_params

        abstract = abstract_params(cfg)
        streamed = count_params(abstract)
        if not cfg.tie_word_embeddings:  # only t rows of the input embedding are gathered
            streamed -= cfg.vocab_size * cfg.hidden_size
        return cls(name=name, streamed_params=streamed, num_layers=cfg.num_layers,
                   kv_width=cfg.num_kv_heads * cfg.head_dim, attn_width=cfg.num_heads * cfg.head_dim)

    def weight_bytes(self, dtype: str) -> float:
        return self.streamed_params * DTYPE_BYTES[dtype]

    def bytes(self, tokens, dtype: str, context: int = 0):
        """Bytes moved by one forward of ``tokens`` parallel tokens over ``context`` cached slots."""
        kv_slot = 2 * self.num_layers * self.kv_width * DTYPE_BYTES[dtype]  # K and V, every layer
        return self.weight_bytes(dtype) + kv_slot * (context + np.asarray(tokens, float))

    def flops(self, tokens, context: int = 0):
        t = np.asarray(tokens, float)
        attention = 4.0 * t * (context + t / 2) * self.num_layers * self.attn_width  # QK^T and PV
        return 2.0 * t * self.streamed_params + attention


def latency(cost: ModelCost, device: Device, tokens, context: int = 0):
    """Modelled seconds of one forward of ``tokens`` parallel tokens (array-like)."""
    memory = cost.bytes(tokens, device.dtype, context) / device.bandwidth
    compute = cost.flops(tokens, context) / device.peak_flops
    return device.overhead_s + np.maximum(memory, compute)


def knee(cost: ModelCost, device: Device, context: int = 0) -> float:
    """Parallel tokens at which compute time reaches memory time (bisection on the monotone difference)."""
    def f(t):
        return cost.flops(t, context) / device.peak_flops - cost.bytes(t, device.dtype, context) / device.bandwidth

    lo, hi = 1e-6, 1.0
    while f(hi) < 0:
        hi *= 2
        if hi > 1e9:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------------------------------------
# A measured curve (the machine at hand).

@dataclasses.dataclass(frozen=True)
class MeasuredCurve:
    """Median forward latencies at measured sizes, with an interpolating model and a fitted roofline.

    ``__call__`` interpolates log-latency linearly in log-tokens between measured sizes, is flat below the
    smallest size and extends the last segment linearly in ``t`` beyond the largest (compute-bound tail).
    The fitted roofline is ``max(bytes / bw_eff, flops(t) / peak_eff)`` with ``bw_eff`` from the 1-token
    latency and ``peak_eff`` the marginal FLOP rate between the two largest sizes.
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        if len(self.tokens) < 2 or len(self.tokens) != len(self.seconds):
            raise ValueError("a measured curve needs at least two (tokens, seconds) points")
        if list(self.tokens) != sorted(set(self.tokens)) or min(self.seconds) <= 0:
            raise ValueError("measured sizes must be increasing and latencies positive")

    def __call__(self, tokens):
        t = np.asarray(tokens, float)
        x, y = np.log(self.tokens), np.log(self.seconds)
        inside = np.exp(np.interp(np.log(np.maximum(t, self.tokens[0])), x, y))
        (t0, t1), (s0, s1) = self.tokens[-2:], self.seconds[-2:]
        slope = max((s1 - s0) / (t1 - t0), 0.0)
        beyond = s1 + slope * (t - t1)
        return np.where(t > t1, beyond, inside)

    def fitted_roofline(self, cost: ModelCost, dtype: str) -> dict:
        (t0, t1), (s0, s1) = self.tokens[-2:], self.seconds[-2:]
        bw = cost.bytes(self.tokens[0], dtype) / self.seconds[0]
        peak = (cost.flops(t1) - cost.flops(t0)) / max(s1 - s0, 1e-12)
        device = Device("fit", bandwidth=float(bw), peak_flops=float(peak), dtype=dtype)
        return {"effective_bandwidth_gb_s": float(bw) / 1e9, "effective_peak_gflop_s": float(peak) / 1e9,
                "knee_tokens": knee(cost, device), "device": device}


def measured_knee(curve: MeasuredCurve, factor: float = 1.5) -> float:
    """Smallest measured size whose latency exceeds ``factor`` x the smallest size's (inf if none)."""
    base = curve.seconds[0]
    return next((float(t) for t, s in zip(curve.tokens, curve.seconds) if s > factor * base), math.inf)


LatencyFn = Callable[[Sequence[float]], np.ndarray]
