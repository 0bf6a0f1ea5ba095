"""Decoding statistics, computed in one place: per prompt (``prompt_stats``) and over prompts (``summarize``).

Every consumer reads these: the decoders' ``GenerationResult.stats``, the CLI's summary table and JSON, the
evaluation, the tuner's TPF grid and the benchmarks. Definitions (docs/method.md, decision 8):

* tokens per forward (TPF) = generated tokens / model forwards, the prefill counted as one forward; over prompts,
  the ratio of the sums (``tokens_per_forward``) and the mean of the per-prompt ratios
  (``mean_tokens_per_forward``);
* tokens per second with and without the prefill's time, over the summed seconds;
* iterations per block (forwards after the prefill spent on each block) and the histogram of tokens accepted per
  iteration, pooled over prompts;
* method counters (recycling rounds and wins, spawns, promotions), summed.
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

import numpy as np

from jf_jax.decoding.common import StopReason

# Per-prompt counters that add up over prompts (the ones a decoder reports).
SUMMED_COUNTERS = ("blocks", "recycling_rounds", "recycling_wins", "spawns", "promotions", "promotions_carried")


# Wall-clock fields: the only ones that differ between two runs of the same decoding.
TIMING_KEYS = ("seconds", "prefill_seconds", "median_seconds", "tokens_per_second", "tokens_per_second_excl_prefill")


def tokens_per_forward(tokens: int, forwards: int) -> float:
    return float(tokens) / max(int(forwards), 1)


def tokens_per_second(tokens: int, seconds: float) -> float:
    return float(tokens) / seconds if seconds > 0 else 0.0


def without_timings(stats: Mapping) -> dict:
    """``stats`` without its wall-clock fields (to compare two runs of the same decoding)."""
    return {k: v for k, v in stats.items() if k not in TIMING_KEYS}


def prompt_stats(*, tokens: int, forwards: int, stop: int, seconds: float | None = None,
                 prefill_seconds: float | None = None, block_iters=None, accept_hist=None,
                 counters: Mapping[str, int] | None = None) -> dict:
    """One prompt's statistics from a finished decoder state (host values).

    ``block_iters`` [max_blocks] (zeros past the last block) and ``accept_hist`` [n + 1] are the block decoders'
    arrays; AR has neither.
    """
    out = dict(tokens=int(tokens), forwards=int(forwards), stop_reason=StopReason(int(stop)).label,
               tokens_per_forward=tokens_per_forward(tokens, forwards))
    if seconds is not None:
        out.update(seconds=float(seconds), prefill_seconds=float(prefill_seconds or 0.0))
        out.update(tokens_per_second=tokens_per_second(tokens, seconds),
                   tokens_per_second_excl_prefill=tokens_per_second(tokens, seconds - (prefill_seconds or 0.0)))
    if block_iters is not None:
        iters = [int(i) for i in block_iters if i > 0]
        hist = [int(h) for h in accept_hist]
        out.update(blocks=len(iters), iterations_per_block=iters,
                   mean_iterations_per_block=float(np.mean(iters)) if iters else 0.0,
                   accepted_per_iteration_histogram=hist,
                   max_accepted_per_iteration=max([k for k, h in enumerate(hist) if h > 0], default=0))
    out.update({k: int(v) for k, v in (counters or {}).items()})
    return out


def summarize(per_prompt: Sequence[Mapping], *, seconds: float | None = None,
              prefill_seconds: float | None = None) -> dict:
    """Totals over prompts of ``prompt_stats`` records.

    Seconds are summed from the records; a call that timed several prompts together (batched AR) passes its
    ``seconds`` / ``prefill_seconds`` instead.
    """
    if not per_prompt:
        raise ValueError("no prompt statistics to summarize")
    tokens = sum(int(p["tokens"]) for p in per_prompt)
    forwards = sum(int(p["forwards"]) for p in per_prompt)
    out = dict(prompts=len(per_prompt), tokens=tokens, forwards=forwards,
               tokens_per_forward=tokens_per_forward(tokens, forwards),
               mean_tokens_per_forward=statistics.fmean(tokens_per_forward(p["tokens"], p["forwards"])
                                                        for p in per_prompt))
    if seconds is None and all("seconds" in p for p in per_prompt):
        seconds = sum(p["seconds"] for p in per_prompt)
        prefill_seconds = sum(p["prefill_seconds"] for p in per_prompt)
        out["median_seconds"] = statistics.median(p["seconds"] for p in per_prompt)
    if seconds is not None:
        prefill_seconds = prefill_seconds or 0.0
        out.update(seconds=float(seconds), prefill_seconds=float(prefill_seconds),
                   tokens_per_second=tokens_per_second(tokens, seconds),
                   tokens_per_second_excl_prefill=tokens_per_second(tokens, seconds - prefill_seconds))
    for key in SUMMED_COUNTERS:
        if all(key in p for p in per_prompt):
            out[key] = sum(int(p[key]) for p in per_prompt)
    if all("iterations_per_block" in p for p in per_prompt):
        iters = [i for p in per_prompt for i in p["iterations_per_block"]]
        out["mean_iterations_per_block"] = float(np.mean(iters)) if iters else 0.0
        hists = [p["accepted_per_iteration_histogram"] for p in per_prompt]
        width = max(len(h) for h in hists)
        out["accepted_per_iteration_histogram"] = [int(x) for x in
                                                   np.sum([np.pad(h, (0, width - len(h))) for h in hists], axis=0)]
    return out


def add_speedups(summary: dict[str, dict], baseline: str = "ar") -> dict[str, dict]:
    """Adds ``speedup_vs_<baseline>`` (tokens/s ratio) to every method's summary when the baseline was run."""
    base = summary.get(baseline, {}).get("tokens_per_second")
    if base:
        for stats in summary.values():
            stats[f"speedup_vs_{baseline}"] = stats["tokens_per_second"] / base
    return summary
