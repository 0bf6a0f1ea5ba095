"""How a benchmark records what it measured: a failing section is one line and a record, never the end of the
run (a lent accelerator gets one shot, so one broken section must not cost the others), and a long run's JSON is
rewritten after every section, so a run stopped by its box keeps what it had."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable


def one_line(error: BaseException) -> str:
    """The error's type and the first line of its message, cut at 200 characters."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def section(report: dict, name: str, fn: Callable, *args):
    """``fn(*args)``; a failure is one printed line and a record in ``report["errors"]``, and None."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001  one section failing must not cost the others
        report.setdefault("errors", {})[name] = one_line(e)
        print(f"{name}: error: {one_line(e)}", flush=True)
        return None


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON at ``path`` (its folder made); values JSON lacks are written as their str."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


@dataclasses.dataclass(frozen=True)
class BudgetedReport:
    """A JSON file rewritten after every section, and a clock that says whether a section still fits the run's
    budget. ``data["sections"][name]`` holds each section's ``result``, ``error`` or ``skipped`` line."""

    path: Path
    deadline: float  # time.monotonic() by which the last section must have ended
    data: dict
    skip: frozenset[str] = frozenset()  # sections not to run (a rerun's)

    @classmethod
    def start(cls, path: Path, budget_s: float, skip: frozenset[str] = frozenset(), **header) -> BudgetedReport:
        report = cls(path, time.monotonic() + budget_s, dict(header, sections={}), skip)
        report.save()
        return report

    def save(self) -> None:
        write_json(self.path, self.data)

    def run(self, name: str, need_s: float, fn: Callable, *args, keep: Callable = lambda result: result):
        """``fn(*args)``'s result (``keep`` of it) under ``sections[name]``; a skip or an error is one line there,
        never the end."""
        if name in self.skip:
            return None
        left = self.deadline - time.monotonic()
        if left < need_s:
            self.data["sections"][name] = dict(skipped=f"{left:.0f} s of the budget left, {need_s:.0f} s needed")
            print(f"{name}: skipped ({left:.0f} s left)", flush=True)
            self.save()
            return None
        start = time.monotonic()
        try:
            result = fn(*args)
            record = dict(result=keep(result))
        except Exception as e:  # noqa: BLE001  one section failing must not cost the others
            result, record = None, dict(error=one_line(e))
            print(f"{name}: error: {one_line(e)}", flush=True)
        record["section_seconds"] = time.monotonic() - start
        self.data["sections"][name] = record
        self.save()
        return result
