"""Decoding statistics, computed in one place: per prompt (``prompt_stats``) and over prompts (``summarize``).

Every consumer reads these, under these key names and no others: the decoders' ``GenerationResult.stats``, the
CLI's summary table and JSON, the evaluation, the ablations, the tuner's TPF grid and the benchmarks; their tables
are drawn by ``eval.stats_table`` from the same keys. Definitions (docs/method.md, section 8):

* ``tpf`` (tokens per forward) = generated tokens / model forwards, the prefill counted as one forward; over
  prompts, the ratio of the sums (``tpf``) and the mean of the per-prompt ratios (``mean_tpf``);
* ``tokens_per_second`` and ``tokens_per_second_excl_prefill``, over the summed seconds;
* ``speedup_vs_ar`` and ``speedup_vs_ar_excl_prefill``: tokens/s over the AR run's (``add_speedups``);
  ``match_ar``: the fraction of prompts whose tokens equal AR's (``match_fraction``);
* iterations per block (forwards after the prefill spent on each block) and the histogram of tokens accepted per
  iteration, pooled over prompts;
* method counters (recycling rounds and wins, spawns, promotions), summed;
* for answers scored by ``eval.answer_quality`` (``repeat_fraction``, ``loops``): ``loop_rate`` and
  ``mean_repeat_fraction``; ``summarize_with_loops`` adds ``mean_tpf_ci95``, the seeded bootstrap 95% interval
  of ``mean_tpf``, and the same summary over the answers that do not loop (``without_loops``).
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

# Resamples of the bootstrap interval of mean TPF: each end's Monte Carlo error is then about 0.06 standard errors
# of the mean, under a fiftieth of the interval's width, so the seed barely moves it.
BOOTSTRAP_RESAMPLES = 2000


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
               tpf=tokens_per_forward(tokens, forwards))
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
               tpf=tokens_per_forward(tokens, forwards),
               mean_tpf=statistics.fmean(tokens_per_forward(p["tokens"], p["forwards"]) for p in per_prompt))
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
    if all("loops" in p for p in per_prompt):  # answers scored by eval.answer_quality
        out["loop_rate"] = statistics.fmean(bool(p["loops"]) for p in per_prompt)
        out["mean_repeat_fraction"] = statistics.fmean(p["repeat_fraction"] for p in per_prompt)
    return out


def bootstrap_mean_interval(values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                            level: float = 0.95) -> list[float]:
    """The percentile bootstrap interval of the mean of ``values``: ``resamples`` resamples of len(values) values
    drawn with replacement by ``numpy.random.default_rng(seed)``, and the (1 - level) / 2 and (1 + level) / 2
    quantiles of their means, as ``[low, high]``. Seeded, so the same values always give the same interval; one
    value gives a zero-width interval, since its resamples cannot vary."""
    if not len(values):
        raise ValueError("no values to bootstrap")
    data = np.asarray(values, np.float64)
    means = data[np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(low), float(high)]


def summarize_with_loops(per_prompt: Sequence[Mapping]) -> dict:
    """``summarize`` of prompts timed one at a time whose records carry ``repeat_fraction`` and ``loops``
    (``eval.answer_quality``), with ``mean_tpf_ci95`` (``bootstrap_mean_interval`` of the per-prompt TPF),
    and under ``without_loops`` the same over the answers that do not loop (None when every answer loops)."""

    def with_interval(records):
        return dict(summarize(records), mean_tpf_ci95=bootstrap_mean_interval([p["tpf"] for p in records]))

    kept = [p for p in per_prompt if not p["loops"]]
    return dict(with_interval(per_prompt), without_loops=with_interval(kept) if kept else None)


def add_speedups(summary: dict[str, dict], baseline: str = "ar") -> dict[str, dict]:
    """Adds ``speedup_vs_<baseline>`` and ``speedup_vs_<baseline>_excl_prefill`` (ratios of tokens/s with and
    without the prefill) to every run's summary when the baseline was run."""
    base = summary.get(baseline, {})
    for key, suffix in (("tokens_per_second", ""), ("tokens_per_second_excl_prefill", "_excl_prefill")):
        if base.get(key):
            for stats in summary.values():
                stats[f"speedup_vs_{baseline}{suffix}"] = stats[key] / base[key]
    return summary


def match_fraction(token_ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float:
    """The fraction of prompts whose generated tokens equal the reference run's (``match_ar`` against AR)."""
    if len(token_ids) != len(reference) or not token_ids:
        raise ValueError(f"cannot match {len(token_ids)} answers against {len(reference)}")
    return statistics.fmean(list(a) == list(b) for a, b in zip(token_ids, reference))
