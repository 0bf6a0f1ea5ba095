"""Tables of ``decoding.stats`` summaries: one renderer, one header and one number format per statistic.

Every table of decoding statistics (the decode CLI's, the evaluation's markdown, the ablations', the engine
benchmark's) is drawn here from rows that hold ``decoding.stats`` keys, so a statistic reads the same everywhere
and no table renames or recomputes one. A row is a mapping: its statistics under their schema keys, and whatever
label fields (model, set, method) the caller adds. A column named ``without_loops.KEY`` reads ``KEY`` from the
row's summary over the answers that do not loop (``stats.summarize_with_loops``).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

MISSING = "-"
"""A cell whose statistic the row lacks (a batched prompt has no seconds of its own, an old file no interval)."""
NESTED_HEADERS = {"without_loops": "without loops"}
"""How a nested summary's name reads after its column's header."""


@dataclasses.dataclass(frozen=True)
class Column:
    key: str
    """The row's key; dotted (``without_loops.mean_tpf``) for a nested summary's."""
    header: str
    spec: str = ""
    """``format`` spec of the value (of each end of a ``[low, high]`` interval); "" for a label (``str``)."""


COLUMNS: dict[str, Column] = {c.key: c for c in (
    Column("prompts", "prompts", "d"),
    Column("tokens", "tokens", "d"),
    Column("forwards", "fwds", "d"),
    Column("tpf", "TPF", ".3f"),
    Column("mean_tpf", "TPF (mean/prompt)", ".3f"),
    Column("mean_tpf_ci95", "mean TPF 95% interval", ".3f"),
    Column("loop_rate", "loop rate", ".2f"),
    Column("repeat_fraction", "4-gram repeats", ".2f"),
    Column("mean_repeat_fraction", "4-gram repeats (mean)", ".2f"),
    Column("loops", "loops"),
    Column("seconds", "sec", ".2f"),
    Column("tokens_per_second", "tok/s", ".1f"),
    Column("tokens_per_second_excl_prefill", "tok/s no prefill", ".1f"),
    Column("speedup_vs_ar", "x AR", ".2f"),
    Column("speedup_vs_ar_excl_prefill", "x AR no prefill", ".2f"),
    Column("match_ar", "= AR", ".2f"),
)}


def column(key: str) -> Column:
    """The column of a schema key (a nested one's header names its summary); any other key is a label column."""
    if key in COLUMNS:
        return COLUMNS[key]
    outer, _, inner = key.partition(".")
    if inner in COLUMNS and outer in NESTED_HEADERS:
        return dataclasses.replace(COLUMNS[inner], key=key, header=f"{COLUMNS[inner].header} {NESTED_HEADERS[outer]}")
    return Column(key, key)


def cell(row: Mapping, col: Column) -> str:
    value = row
    for part in col.key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return MISSING
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format(v, col.spec) for v in value) + "]"
    return format(value, col.spec) if col.spec else str(value)


def render_table(rows: Sequence[Mapping], columns: Sequence[str | Column], *, markdown: bool = True) -> str:
    """``rows`` under ``columns`` (schema keys, or ``Column``s for a caller's own fields): a markdown table, or
    with ``markdown=False`` a plain-text one for the terminal, labels left-aligned and numbers right-aligned."""
    cols = [c if isinstance(c, Column) else column(c) for c in columns]
    cells = [[cell(row, c) for c in cols] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(c.header for c in cols) + " |", "|" + "---|" * len(cols)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]

    def line(texts):
        return " ".join(t.rjust(w) if c.spec else t.ljust(w) for t, w, c in zip(texts, widths, cols)).rstrip()

    header = line([c.header for c in cols])
    return "\n".join([header, "-" * len(header)] + [line(r) for r in cells])
