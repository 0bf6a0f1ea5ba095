"""Whether a generated answer loops: the 4-gram repeat fraction and the loop rule of the evaluation.

A model fine-tuned for parallel decoding can fall into a loop (the same phrase again and again until the token
cap), and a looping answer is cheap to decode in parallel: its Jacobi drafts converge at once. Mean TPF over
answers that loop therefore flatters the model, so the evaluation reports TPF with and without them
(``decoding.stats.summarize_with_loops``; docs/method.md, section 8).
"""

from __future__ import annotations

from typing import Sequence

REPEAT_NGRAM = 4
"""The n of the n-grams whose repeats are counted (as the trajectory collector's repetition filter does)."""
LOOP_REPEAT_FRACTION = 0.5
"""The repeat fraction from which an answer that ran to the token cap loops."""
TOKEN_CAP_STOP = "max_new_tokens"
"""The stop reason (``decoding.common.StopReason`` label) of an answer cut by the token cap rather than EOS."""


def repeat_fraction(token_ids: Sequence[int], ngram: int = REPEAT_NGRAM) -> float:
    """The share of the answer's ``ngram``-grams that repeat an earlier one.

    The answer's n-grams are its len - n + 1 overlapping windows; a window is a repeat when the same n tokens
    start at an earlier position (overlap allowed). So the fraction is 1 - distinct windows / windows: 0.0 when
    no n-gram occurs twice, and (len - n - p + 1) / (len - n + 1) for an answer that is one period-p cycle from
    its first token. An answer shorter than n tokens has no n-grams and a fraction of 0.0.
    """
    tokens = [int(t) for t in token_ids]
    windows = [tuple(tokens[i:i + ngram]) for i in range(len(tokens) - ngram + 1)]
    return 1.0 - len(set(windows)) / len(windows) if windows else 0.0


def loops(token_ids: Sequence[int], stop_reason: str) -> bool:
    """The loop rule: the answer ran to the token cap (``stop_reason`` is ``max_new_tokens``, no EOS) and at
    least half of its 4-grams repeat an earlier one (``repeat_fraction`` >= ``LOOP_REPEAT_FRACTION``), i.e. a
    repeated phrase fills about half the answer or more. An answer that ends on EOS never loops, however
    repetitive: it stopped by itself."""
    return stop_reason == TOKEN_CAP_STOP and repeat_fraction(token_ids) >= LOOP_REPEAT_FRACTION


def answer_quality(token_ids: Sequence[int], stop_reason: str) -> dict:
    """The answer-quality fields of a per-prompt record: ``repeat_fraction`` and ``loops``."""
    return dict(repeat_fraction=repeat_fraction(token_ids), loops=loops(token_ids, stop_reason))
