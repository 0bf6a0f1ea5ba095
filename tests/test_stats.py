"""The evaluation's loop-aware statistics: the 4-gram repeat fraction, the loop rule, the bootstrap interval of
mean TPF, the summaries with and without looping answers, and the one table renderer (``decoding.stats``,
``eval.answer_quality``, ``eval.stats_table``), each against hand-made cases."""

import numpy as np
import pytest

from jf_jax.decoding.common import StopReason
from jf_jax.decoding.stats import (add_speedups, bootstrap_mean_interval, match_fraction, prompt_stats, summarize,
                                   summarize_with_loops)
from jf_jax.eval.answer_quality import answer_quality, loops, repeat_fraction
from jf_jax.eval.stats_table import Column, render_table

CAP = StopReason.MAX_NEW_TOKENS.label
EOS = StopReason.EOS.label


@pytest.mark.parametrize("tokens, expected", [
    ([], 0.0),
    ([1, 2, 3], 0.0),  # shorter than a 4-gram
    ([1, 2, 3, 4, 5, 6, 7, 8], 0.0),  # no 4-gram twice
    ([1, 2, 3, 4, 1, 2, 3, 4], 1 / 5),  # windows 1234 2341 3412 4123 1234: the last repeats the first
    ([7] * 10, 6 / 7),  # seven windows, all "7 7 7 7": every one but the first repeats
    ([1, 2, 3] * 6, 12 / 15),  # one period-3 cycle: (len - 4 - 3 + 1) / (len - 4 + 1)
    ([9, 9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9], 1 / 13),  # the same 4-gram far apart still repeats
])
def test_repeat_fraction_of_hand_made_answers(tokens, expected):
    assert repeat_fraction(tokens) == pytest.approx(expected)


def test_repeat_fraction_counts_overlapping_earlier_windows_once_each():
    # "1 1 1 1 1": windows at 0 and 1 are both "1 1 1 1" (they overlap); only the second is a repeat
    assert repeat_fraction([1, 1, 1, 1, 1]) == pytest.approx(1 / 2)
    assert repeat_fraction(np.asarray([5, 6, 5, 6, 5, 6])) == pytest.approx(1 / 3)  # numpy ids read alike


def test_loop_rule_needs_the_token_cap_and_half_the_4grams_repeated():
    cycle = [11, 12, 13, 14, 15] * 8  # 40 tokens, period 5: 37 windows, 5 distinct, 32 repeats
    assert loops(cycle, CAP) and not loops(cycle, EOS)  # an answer that stops on EOS never loops
    assert not loops(list(range(40)), CAP)  # ran to the cap without repeating: long, not looping
    # exactly at the threshold: 8 distinct windows of 16 (a period-8 cycle of 19 tokens) -> 0.5, which loops
    half = list(range(8)) * 2 + [0, 1, 2]
    assert repeat_fraction(half) == 0.5 and loops(half, CAP)
    assert not loops(half[:-1], CAP)  # one window fewer: 7 of 15 repeat, under half
    fresh_then_loop = list(range(100, 130)) + [1, 2] * 15  # 30 fresh tokens, then a 30-token loop
    assert 0.4 < repeat_fraction(fresh_then_loop) < 0.5 and not loops(fresh_then_loop, CAP)
    assert answer_quality(cycle, CAP) == dict(repeat_fraction=32 / 37, loops=True)


def test_bootstrap_interval_holds_the_mean_and_is_deterministic():
    values = [1.0, 1.2, 1.1, 1.9, 1.05, 1.3, 2.4, 1.0]
    low, high = bootstrap_mean_interval(values)
    assert low < np.mean(values) < high
    assert bootstrap_mean_interval(values) == [low, high]  # seeded: the same interval every call
    assert bootstrap_mean_interval(values, seed=1) != [low, high]
    assert min(values) <= low and high <= max(values)
    narrow = bootstrap_mean_interval(values, level=0.5)
    assert low < narrow[0] < narrow[1] < high
    assert bootstrap_mean_interval([1.5]) == [1.5, 1.5]  # one prompt: nothing to resample
    assert bootstrap_mean_interval([2.0] * 5) == [2.0, 2.0]
    with pytest.raises(ValueError):
        bootstrap_mean_interval([])


def _record(tokens, forwards, token_ids, stop):
    code = StopReason.MAX_NEW_TOKENS if stop == CAP else StopReason.EOS
    return dict(prompt_stats(tokens=tokens, forwards=forwards, stop=code, seconds=1.0, prefill_seconds=0.25),
                **answer_quality(token_ids, stop))


def test_summaries_with_and_without_looping_answers():
    looping = _record(40, 5, [11, 12, 13, 14, 15] * 8, CAP)  # TPF 8: a loop decodes fast
    plain = [_record(20, 10, list(range(20)), EOS), _record(30, 20, list(range(30)), CAP)]  # TPF 2 and 1.5
    s = summarize_with_loops([looping, *plain])
    assert s["prompts"] == 3 and s["tpf"] == pytest.approx(90 / 35) and s["mean_tpf"] == pytest.approx(11.5 / 3)
    assert s["loop_rate"] == pytest.approx(1 / 3)
    assert s["mean_repeat_fraction"] == pytest.approx(32 / 37 / 3)
    assert s["mean_tpf_ci95"][0] <= s["mean_tpf"] <= s["mean_tpf_ci95"][1]
    kept = s["without_loops"]
    assert kept["prompts"] == 2 and kept["tpf"] == pytest.approx(50 / 30) and kept["mean_tpf"] == 1.75
    assert kept["loop_rate"] == 0.0 and kept["mean_tpf_ci95"][0] <= 1.75 <= kept["mean_tpf_ci95"][1]
    assert summarize_with_loops([looping])["without_loops"] is None  # every answer loops: nothing to summarize
    assert "loop_rate" not in summarize([prompt_stats(tokens=4, forwards=4, stop=StopReason.EOS)])  # unscored


def test_speedups_and_match_against_ar():
    runs = add_speedups(dict(ar=dict(tokens_per_second=10.0, tokens_per_second_excl_prefill=20.0),
                             jacobi=dict(tokens_per_second=15.0, tokens_per_second_excl_prefill=50.0)))
    assert runs["jacobi"]["speedup_vs_ar"] == 1.5 and runs["jacobi"]["speedup_vs_ar_excl_prefill"] == 2.5
    assert runs["ar"]["speedup_vs_ar"] == 1.0
    assert "speedup_vs_ar" not in add_speedups(dict(mr=dict(tokens_per_second=1.0)))["mr"]  # no AR run
    assert match_fraction([[1, 2], [3], [4]], [[1, 2], [3, 5], [4]]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        match_fraction([[1]], [[1], [2]])


def test_one_renderer_draws_every_table_from_the_schema_keys():
    rows = [dict(method="ar", tpf=1.0, mean_tpf_ci95=[0.95, 1.05], loop_rate=0.0, without_loops=dict(mean_tpf=1.0)),
            dict(method="jacobi n=16", tpf=1.23456, loop_rate=0.5, without_loops=None, extra=3)]
    md = render_table(rows, ["method", "tpf", "mean_tpf_ci95", "loop_rate", "without_loops.mean_tpf",
                             Column("extra", "own column", "d")])
    assert md.splitlines() == [
        "| method | TPF | mean TPF 95% interval | loop rate | TPF (mean/prompt) without loops | own column |",
        "|---|---|---|---|---|---|",
        "| ar | 1.000 | [0.950, 1.050] | 0.00 | 1.000 | - |",
        "| jacobi n=16 | 1.235 | - | 0.50 | - | 3 |"]  # a missing statistic is "-", never a rename
    text = render_table(rows, ["method", "tpf"], markdown=False).splitlines()
    assert text[0].split() == ["method", "TPF"] and text[3].split() == ["jacobi", "n=16", "1.235"]
    assert len({len(line) for line in text[2:]}) == 1  # aligned columns
