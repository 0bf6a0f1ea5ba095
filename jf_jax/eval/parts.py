"""A multi-process evaluation (``jf-jax evaluate --distributed``): each process evaluates its share of every prompt
set and problem set, writes the results to its part file beside the report, and process 0 merges the parts into the
report a one-process run writes.

A share is a contiguous range of a set (``share``): the decoders key prompt i of a call by ``first_index + i`` (its
drafts and its sampling), so a share decoded in one call from its first index in the set draws what the one-process
run draws for the same prompts. The GSM and HumanEval shares are cut at whole ``--math-batch`` batches, so every
batch holds the problems it holds in a one-process run.

Every cell of the report is a pure function of its per-prompt records or per-problem items
(``speed.run_summary``, ``speed.compare_with_ar``, the ``quality`` summaries), so ``merge_results`` recomputes each
one over the union of the parts, in the set's order: whatever does not depend on the clock (tokens, TPF, equality
with AR, loops, quality) is the one-process run's. Tokens/s is not: it sums per-prompt times measured while the
processes shared the machines, and the report says so (``report.markdown``).
"""

from __future__ import annotations

import dataclasses
import glob
import re

QUALITY_KEYS = ("math", "humaneval", "humaneval_nll")
"""A result's quality scores, each a summary of per-problem items (``eval.quality``)."""


@dataclasses.dataclass(frozen=True)
class Process:
    """Which process of how many evaluates: its share of every set is ``share(..., index, count)``."""

    index: int = 0
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Share:
    """A contiguous range of a set: ``count`` rows from index ``first``."""

    first: int
    count: int

    def take(self, rows: list) -> list:
        return rows[self.first:self.first + self.count]

    def pair(self) -> list[int]:
        """[first, count], as a part records it."""
        return [self.first, self.count]


def share(total: int, process: Process, unit: int = 1) -> Share:
    """``process``'s share of a set of ``total`` rows: whole ``unit``-row groups (a decoding batch), as evenly as
    they divide among the processes; a process beyond the groups gets an empty share."""
    groups = -(-total // unit)
    first = min(process.index * groups // process.count * unit, total)
    end = min((process.index + 1) * groups // process.count * unit, total)
    return Share(first, end - first)


def part_stem(out: str, process: Process) -> str:
    """Where ``process`` writes its part (``OUT.process-I-of-N``, then ``.json``): beside the report."""
    return f"{out}.process-{process.index:03d}-of-{process.count:03d}"


def part_counts(out: str) -> set[int]:
    """The process counts of the parts beside the report ``out``."""
    pattern = re.compile(r"\.process-\d{3}-of-(\d{3})\.json$")
    return {int(m.group(1)) for path in glob.glob(glob.escape(out) + ".process-*-of-*.json")
            if (m := pattern.search(path))}


def _pieces(values: list, shares: list[list[int]], what: str) -> list:
    """The non-empty parts' ``values`` of one set, checked to cover it in order (each share starts where the
    previous one ended): parts of one run, not of two."""
    end = 0
    for first, count in shares:
        if first != end:
            raise ValueError(f"the parts' shares of {what} do not follow each other ({shares})")
        end += count
    return [v for v, (_, count) in zip(values, shares) if count]


def _merge_set(pieces: list[dict]) -> dict[str, dict]:
    """One prompt set's runs over the union of the parts' ``pieces`` (each a ``speed.speed_of_set`` result)."""
    from jf_jax.eval.speed import compare_with_ar, run_summary

    per_run = {}
    for name, cell in pieces[0].items():
        cells = [piece[name] for piece in pieces]
        per_run[name] = run_summary(cell["method"], cell["block_size"], [p for c in cells for p in c["per_prompt"]],
                                    [t for c in cells for t in c["token_ids"]])
    return compare_with_ar(per_run)


def _merge_quality(key: str, pieces: list[dict]) -> dict:
    from jf_jax.eval.quality import gsm_summary, humaneval_summary, nll_summary

    items = [item for piece in pieces for item in piece["items"]]
    if key == "humaneval_nll":
        return nll_summary(items)
    summary = gsm_summary if key == "math" else humaneval_summary
    return summary(items, max_new_tokens=pieces[0]["max_new_tokens"])


def merge_results(parts: list[dict]) -> dict:
    """One model's result from its parts (every process's result, in process order, each with its ``shares``):
    the result the one-process run gives, but for timings; ``seconds`` is the slowest process's."""
    shares = [part["shares"] for part in parts]
    merged = {k: v for k, v in parts[0].items() if k != "shares"}
    merged["speed"] = {}
    for name in shares[0]["speed"]:
        pieces = _pieces([part["speed"].get(name) for part in parts], [s["speed"][name] for s in shares], name)
        merged["speed"][name] = _merge_set(pieces)
    for key in QUALITY_KEYS:
        pieces = _pieces([part[key] for part in parts], [s[key] for s in shares], key)
        merged[key] = _merge_quality(key, pieces) if pieces else None
    if all("seconds" in part for part in parts):
        merged["seconds"] = max(part["seconds"] for part in parts)
    return merged
