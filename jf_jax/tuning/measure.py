"""The tuner's measurements on this machine: the forward-latency curve against parallel tokens
(``measure_latency``), the read bandwidth that bounds a one-token step (``read_bandwidth_gbs``,
``step_weight_bytes``) and the tokens-per-forward grid of the mr decoder over block and verification sizes
(``TPFCell``, ``measure_tpf``; ``cells_from_report`` reads a grid back from an earlier ``tuned.json``).

TPF depends on the model and the data, not on the hardware; latency depends on the hardware. Both take token-id
prompts and a loaded model's parameters, so nothing here knows about tokenizers or command lines.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

from jf_jax.decoding import stats
from jf_jax.tuning import roofline

LATENCY_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCK_SIZES = (4, 8, 16, 32, 64)
POOL_SIZES = (1, 2, 4)
TUNE_PROMPTS = 3  # the first built-in prompts the tuner decodes when given none
TUNE_TOKENS = 32  # 3 prompts x 32 tokens: the grid runs ~1300 forwards on a 2-core CPU
NUM_BLOCKS = 1  # K of the grid: 1 = Jacobi with recycling (parallel tokens n * p); the paper fixes K=2 first


def measure_latency(params, cfg, sizes: Sequence[int] = LATENCY_SIZES, *, context: int = 128, repeats: int = 5,
                    progress=None) -> roofline.MeasuredCurve:
    """Median seconds of one cached forward (+ float32 logits and argmax, as the decoders do) of ``t`` tokens
    over ``context`` committed slots, for each ``t`` in ``sizes`` (one compiled program per size).

    Every size is compiled first; then each repeat times every size once, in turn, so when the machine's speed
    drifts during the measurement (a shared machine's often does) every size sees the same drift, and the curve's
    shape (the ratios the tuner and the doctor read) does not depend on when each size happened to run."""
    import jax
    import jax.numpy as jnp

    from jf_jax.decoding.common import greedy
    from jf_jax.model.decode_jit import decode_jit
    from jf_jax.model.decode_view import as_decode_view
    from jf_jax.model.kv_cache import KVCache
    from jf_jax.model.transformer import forward, logits

    params = as_decode_view(params)

    @decode_jit
    def step(params, tokens, cache):
        hidden, cache = forward(params, cfg, tokens, cache=cache)
        return greedy(logits(params, cfg, hidden)), cache

    inputs = {}
    for t in sizes:
        if progress is not None:
            progress.set_postfix_str(f"latency t={t}")
        cache = KVCache.init(cfg, 1, context + t).with_lengths(context)
        inputs[t] = ((jnp.arange(t, dtype=jnp.int32) * 7919 % cfg.vocab_size)[None], cache)
        jax.block_until_ready(step(params, *inputs[t]))  # compile + warm up
        if progress is not None:
            progress.update()
    times = {t: [] for t in sizes}
    for _ in range(repeats):
        for t in sizes:
            start = time.perf_counter()
            jax.block_until_ready(step(params, *inputs[t]))
            times[t].append(time.perf_counter() - start)
    return roofline.MeasuredCurve(tuple(int(t) for t in sizes), tuple(statistics.median(times[t]) for t in sizes))


def read_bandwidth_gbs(size_bytes: int = 1 << 30, threads: int = 2, repeats: int = 5) -> float:
    """Best-of-``repeats`` read bandwidth in GB/s: ``threads`` threads each sum their part of a float32 array."""
    import threading

    import numpy as np

    data = np.ones(size_bytes // 4, np.float32)
    parts = np.array_split(data, threads)
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=np.sum, args=(p,)) for p in parts]  # numpy releases the GIL
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, data.nbytes / (time.perf_counter() - start) / 1e9)
    return best


def step_weight_bytes(view) -> int:
    """Bytes of weights a one-token step reads in the decode view: every layer, the final norm and the output
    projection (the embedding table when it is tied and unsplit; a step looks up only its token's row). Over the
    read bandwidth, this bounds AR's tokens per second."""
    import jax

    head = view.lm_head if view.lm_head is not None else view.embed  # bits or table: the same bytes
    return sum(x.nbytes for x in jax.tree.leaves((view.layers, view.final_norm, head)))


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
        return stats.tokens_per_forward(self.tokens, self.forwards)

    @property
    def recycle_fraction(self) -> float:
        return self.recycling_rounds / max(self.forwards, 1)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "tpf": self.tpf, "recycle_fraction": self.recycle_fraction}


def measure_tpf(params, cfg, prompts: Sequence[Sequence[int]], eos_ids: Sequence[int], *,
                block_sizes: Sequence[int] = BLOCK_SIZES, pool_sizes: Sequence[int] = POOL_SIZES,
                num_blocks: int = NUM_BLOCKS, spawn_ratio: float = 0.85, max_new_tokens: int = TUNE_TOKENS,
                seed: int = 0, progress=None) -> list[TPFCell]:
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


def cells_from_report(report: dict) -> list[TPFCell]:
    """The TPF grid of an earlier report (``tuned.json``)."""
    names = {f.name for f in dataclasses.fields(TPFCell)}
    return [TPFCell(**{k: v for k, v in c.items() if k in names}) for c in report["tpf"]]
