"""What the accelerator benchmarks share about the machine and the model: the backend and versions, device memory
in use, the device's memory bandwidth, the named model configs they build random weights for, and random
prompts. Speed and memory do not depend on trained values, so random weights of a published config measure them
without a download."""

from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.benchmarks.records import one_line
from jf_jax.model.config import ModelConfig

TINY_CONFIG = ModelConfig(architecture="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=2048, attention_bias=False, tie_word_embeddings=True)
"""A 2-layer model for the CPU smoke tests; tied embeddings like SmolLM2, so the weight count takes that path."""

CONFIG_NAMES = ("tiny", "smollm2-135m", "qwen2.5-7b")


def named_config(name: str) -> ModelConfig:
    """The shapes a benchmark's ``--config NAME`` stands for (one of ``CONFIG_NAMES``)."""
    if name == "tiny":
        return TINY_CONFIG
    if name == "smollm2-135m":
        from jf_jax.weights import embedded

        return embedded.SMOLLM2_135M_CONFIG
    if name == "qwen2.5-7b":
        from jf_jax.model.config import QWEN2P5_7B_HF_CONFIG, from_hf_config

        return from_hf_config(QWEN2P5_7B_HF_CONFIG)
    raise ValueError(f"no benchmark config {name!r}; known: {', '.join(CONFIG_NAMES)}")


def environment() -> dict:
    """The versions, backend, devices and ``XLA_FLAGS`` a measurement ran under."""
    import jaxlib

    return dict(jax=jax.__version__, jaxlib=getattr(jaxlib, "__version__", None), backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()], device_kind=jax.devices()[0].device_kind,
                xla_flags=os.environ.get("XLA_FLAGS"))


def device_memory() -> dict:
    """The first device's memory limit, bytes in use and peak, as far as its backend reports them."""
    stats = jax.devices()[0].memory_stats() or {}
    return {k: stats[k] for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use") if k in stats}


def random_prompts(cfg: ModelConfig, count: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, length).tolist() for _ in range(count)]


def measure_bandwidth(mib: int, iters: int = 20) -> dict:
    """Device memory bandwidth from ``mib`` MiB moved by a few jitted ops (bytes read + written / median time of
    ``iters``); the best is the bandwidth (the bound is a ceiling). ``x + 1`` rather than ``x + 0``, which XLA may
    simplify to ``x``; ``jnp.copy`` is a plain device-to-device copy. On an H100, bf16 ``x + 1`` alone came out
    well below a copy in one session: hence several kernels, and 2-D arrays."""
    ops = {"copy bf16": (jnp.bfloat16, jnp.copy), "x + 1 bf16": (jnp.bfloat16, lambda x: x + jnp.ones((), x.dtype)),
           "x + 1 f32": (jnp.float32, lambda x: x + jnp.ones((), x.dtype))}
    results = {}
    for name, (dtype, op) in ops.items():
        n = mib * 2**20 // jnp.dtype(dtype).itemsize
        try:
            x = jnp.ones((n // 1024, 1024), dtype)  # 2-D: rows of 1024 keep every fusion's loads wide
            step = jax.jit(op)
            jax.block_until_ready(step(x))
            samples = []
            for _ in range(iters):
                begin = time.perf_counter()
                jax.block_until_ready(step(x))
                samples.append(time.perf_counter() - begin)
            seconds = statistics.median(samples)
            results[name] = dict(median_seconds=seconds, bytes_per_second=2 * x.nbytes / seconds)
            del x
        except Exception as e:  # noqa: BLE001  one kernel failing (e.g. out of memory) leaves the others
            results[name] = dict(error=one_line(e))
    timed = {k: v for k, v in results.items() if "bytes_per_second" in v}
    if not timed:
        raise RuntimeError("no bandwidth kernel ran: " + "; ".join(f"{k}: {v['error']}" for k, v in results.items()))
    best = max(timed, key=lambda k: timed[k]["bytes_per_second"])
    return dict(mib=mib, iters=iters, kernels=results, best=best, median_seconds=timed[best]["median_seconds"],
                bytes_per_second=timed[best]["bytes_per_second"])
