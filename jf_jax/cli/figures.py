"""Check that every measured figure in README.md and docs/*.md comes from a committed file under results/.

    python -m jf_jax.cli.figures              # list every figure that fails a rule (file:line), exit 1 if any
    python -m jf_jax.cli.figures --list       # also list every figure checked and where it was found

**Units.** A doc is cut into units: a paragraph, a list item (its continuation lines included) or a table row.
Fenced code blocks are skipped, and so is generated text checked elsewhere: README's results table between its
``<!-- results-table:start -->`` / ``end`` markers and docs/results.md (``python -m jf_jax.cli.results --check``).

**Figures.** In a unit's prose (inline code, link targets and HTML comments removed), a figure is

- a number with a unit: ``tok/s``, ``tokens/s``, ``responses/s``, ``steps/s``, ``ms``, ``s``, ``min``, ``%``,
  ``x`` / ``×`` written against the number (``1.46x``; ``4x128`` is a shape, not a figure), ``GB``, ``GiB``,
  ``MB``, ``MiB``, ``TB/s``, ``GB/s``, ``TFLOP/s``, ``nats`` ...; both ends of a range (``1.2-1.3x``,
  ``19-26 min``, ``0.25 to 0.75``) count;
- any decimal number (``1.39``, a TPF), with or without a unit;
- a ratio of counts, ``N of M`` or ``N/M`` (``36 of 36``, ``11/164``): a linked file must state it as a ratio
  (``N of M``, ``N/M``, ``N out of M``) or hold both numbers on one line of a text file (a table row).

**Not figures**: whole numbers without a unit (a count, a block size, a date), numbers inside identifiers
(``Qwen2.5``, ``float32``, ``7B``, ``Llama-3.1``, a commit hash), version numbers (``0.10.2``, ``Python 3.11``,
``jax 0.10.2``), an arXiv id, settings written as ``name = value`` (``r = 0.85``), and anything in inline code: a
command, an option value, a config default or a threshold of the code is written as code (``--limit 8``, ``0.5``)
and is not a measurement. **Not checked**: the rows of a table with a ``source`` column (figures quoted from the
publication each row names, such as a vendor's datasheet, not measured here) and of a settings table, whose first
column is headed ``key`` or ``option`` (config keys, command options and statistics' names with their defaults).

**Rule (a): a link into results/.** A unit that states a figure must link into ``results/`` (a file, or a folder:
its .md, .json and .txt files and those of its sub-folders one level down), itself, through the unit that
introduces it (the list item a nested item or indented table sits in; the paragraph right before a list or table),
or through a link to a section of README.md or docs/*.md (``[Measured](#measured)``), whose own links into
``results/`` then count. A link to a whole doc (no ``#section``) is too broad to count. docs/results.md, the
generated index, counts as a results file: every number in it is read from ``results/``.

**Rule (b): the number is in a linked file**, up to formatting: ``1,234`` = ``1234``, ``1.50`` = ``1.5``, ``x`` vs
``×``, a fraction for a percentage (``0.64`` for ``64%``), a figure in ms recorded in seconds (``0.0032551`` for
``3.26 ms``), and, in a file of raw recorded values (JSON, JSON lines), a longer number rounded to the figure's last
digit (``0.6412`` for ``0.64``) when the figure keeps two significant digits or more. A markdown, text or log file
writes its numbers to be read as written: a figure quoting it must be that number (``1.394``, not ``1.39``).

**Markers** (visible in the doc, right after the figure they qualify; a range counts as one figure):

- ``(derived: A / B)``: the figure is computed from others. The expression (numbers, ``+ - * /``, brackets) must
  give the figure to its last digit, and each of its numbers must itself be in a linked file (``100``, ``1000``,
  ``1024`` and ``60`` may also stand as unit factors). A range takes one expression per end, separated by ``;``.
- ``(unrecorded)`` or ``(unrecorded: why)``: the figures of its sentence before it were measured, but no
  committed file holds them. They are not checked, and ``--list`` reports them: the doc says so rather than
  pretending a source.
"""
from __future__ import annotations

import argparse
import ast
import operator
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

from jf_jax.cli.figures_text import (
    DOCS, FOLDER_SUFFIXES, GENERATED_FILES, Problem, RAW_SUFFIXES, SOURCE_SUFFIXES, UNIT_FACTORS, UNIT_SYNONYMS, Unit,
    CODE, COMMENT, LINK, SOURCE_NUMBER, as_decimal, figures, parse,
)


class Sources:
    """The numbers of committed files under results/, read once each."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self._numbers: dict[Path, set[Decimal]] = {}
        self._rounded: dict[Path, dict[int, set[Decimal]]] = {}
        self._texts: dict[Path, str] = {}
        self._lines: dict[Path, list[list[Decimal]]] = {}

    def holds_pair(self, path: Path, n: Decimal, m: Decimal) -> bool:
        """Whether ``path`` states the ratio ``n`` of ``m``: written as such (``n of m``, ``n/m``, ``n / m``,
        ``n out of m``), or both numbers on one line (a table row: ``| 164 | 384 | 4 |``; twice when equal)."""
        if path not in self._lines:
            text = path.read_text(errors="replace")
            self._texts[path] = text
            self._lines[path] = [[as_decimal(t.group()) for t in SOURCE_NUMBER.finditer(line)
                                  if re.fullmatch(r"[\d,]+", t.group())] for line in text.splitlines()]

        def form(v: Decimal) -> str:
            plain = str(int(v))
            return f"(?:{plain}|{int(v):,})" if len(plain) > 3 else plain

        pattern = rf"(?<![\d.,]){form(n)}\s*(?:of|/|out of)\s*{form(m)}(?![\d]|[.,]\d)"
        if re.search(pattern, self._texts[path]):
            return True
        if path.suffix in RAW_SUFFIXES:
            return False  # a line of raw values is no table row: two counts on it say nothing of a ratio
        for numbers in self._lines[path]:
            if (n != m and n in numbers and m in numbers) or (n == m and numbers.count(n) >= 2):
                return True
        return False

    def files(self, target: Path) -> list[Path]:
        """A results file, or a results folder's text files and those of its sub-folders one level down."""
        if target.is_file():
            return [target] if target.suffix in SOURCE_SUFFIXES else []
        if not target.is_dir():
            return []
        found = []
        for p in sorted(target.iterdir()):
            if p.is_file() and p.suffix in FOLDER_SUFFIXES:
                found.append(p)
            elif p.is_dir():
                found += [q for q in sorted(p.iterdir()) if q.is_file() and q.suffix in FOLDER_SUFFIXES]
        return found

    def _load(self, path: Path) -> None:
        """The file's numbers as written, a fraction also as a percentage; and in a file of raw recorded values
        (JSON), each rounded to fewer decimals."""
        if path in self._numbers:
            return
        exact: set[Decimal] = set()
        rounded: dict[int, set[Decimal]] = {}
        raw_values = path.suffix in RAW_SUFFIXES
        for m in SOURCE_NUMBER.finditer(path.read_text(errors="replace")):
            try:
                value = as_decimal(m.group())
            except InvalidOperation:
                continue
            forms = [value] + ([value * 100] if value <= 1 else [])  # 0.64 for 64%
            for v in forms:
                exact.add(v.normalize())
                exponent = v.as_tuple().exponent
                if not raw_values or not isinstance(exponent, int) or exponent >= 0:
                    continue
                for d in range(0, min(-exponent, 8)):
                    for mode in (ROUND_HALF_UP, ROUND_HALF_EVEN):
                        rounded.setdefault(d, set()).add(v.quantize(Decimal(1).scaleb(-d), rounding=mode))
        self._numbers[path] = exact
        self._rounded[path] = rounded

    def holds(self, path: Path, value: Decimal, raw: str, unit: str | None = None) -> bool:
        """Whether ``path`` holds the number ``value`` (written ``raw``, with ``unit``) up to formatting; a figure
        in ms may be recorded in seconds."""
        if unit == "ms" and self._holds(path, value / 1000, raw, None):
            return True
        return self._holds(path, value, raw, unit)

    def _holds(self, path: Path, value: Decimal, raw: str, unit: str | None) -> bool:
        self._load(path)
        if "e" in raw.lower():  # 1.5e-4: the recorded value to the same significant digits
            digits = len(raw.lower().split("e")[0].replace(".", "").lstrip("0"))
            return any(v != 0 and f"{v:.{digits - 1}e}" == f"{value:.{digits - 1}e}" for v in self._numbers[path])
        if value.normalize() in self._numbers[path]:
            return unit is None or "." in raw or path.suffix in RAW_SUFFIXES or self._with_unit(path, value, unit)
        significant = len(str(value.normalize()).replace(".", "").lstrip("0"))
        decimals = -value.as_tuple().exponent if value.as_tuple().exponent < 0 else 0
        if significant < 2:
            return False
        return value in self._rounded[path].get(decimals, set())

    def _with_unit(self, path: Path, value: Decimal, unit: str) -> bool:
        """A whole number with a unit (``7%``, ``30 s``, ``3x``), which a prose file holds by chance too often: it
        must carry that unit there (``30 s``, ``28-30 s``), stand in a table row, or, for a percentage, be the
        fraction (``0.07``)."""
        text = self._texts.setdefault(path, path.read_text(errors="replace"))
        plain = str(int(value))
        number = f"(?:{plain}|{int(value):,})" if len(plain) > 3 else plain
        units = UNIT_SYNONYMS.get(unit, re.escape(unit))
        if re.search(rf"(?<![\d.,]){number}(?:\.0+)?(?:\s?[-–]\s?[\d.,]+)?\s?(?:{units})(?![\w])", text):
            return True
        if re.search(rf"^\s*\|.*(?<![\d.,]){number}(?![\d]|[.,]\d).*\|\s*$", text, re.M):
            return True
        return unit == "%" and any(v == value / 100 for v in self._numbers[path] if v < 1)


# ---------------------------------------------------------------------------------------------------- checking


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(expression: str) -> tuple[Decimal, list[str]]:
    """The value of a derived expression and its numbers as written."""
    numbers = []

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            raw = ast.get_source_segment(source, node)
            numbers.append(raw)
            return Decimal(raw)
        raise ValueError(f"not a number or + - * /: {ast.dump(node)}")

    source = " ".join(expression.replace(",", "").replace("×", "*").split())  # it may wrap across lines
    return walk(ast.parse(source, mode="eval")), numbers


def _rounds_to(value: Decimal, figure: Decimal) -> bool:
    exponent = figure.as_tuple().exponent
    step = Decimal(1).scaleb(exponent if exponent < 0 else 0)
    return abs(value - figure) <= step / 2 + Decimal("1e-12")


SETTINGS_HEADERS = ("key", "option")
"""A table whose first column is headed so lists settings (config keys, command options, statistics' names): its
numbers are defaults and definitions, not measurements."""


def _header_cells(unit: Unit) -> list[str]:
    return [cell.strip().lower() for cell in (unit.header or "").strip().strip("|").split("|")]


def quotes_its_source(unit: Unit) -> bool:
    """A row whose figures are not measurements to check: a row of a table with a ``source`` column (quoted from
    the publication the row names, a vendor's datasheet) or of a settings table (``SETTINGS_HEADERS``)."""
    if unit.kind != "row" or unit.header is None:
        return False
    cells = _header_cells(unit)
    return "source" in cells or cells[0] in SETTINGS_HEADERS


def doc_links(unit: Unit) -> list[str]:
    """The link targets of a unit and of the units that introduce it."""
    targets = []
    while unit is not None:
        text = COMMENT.sub("", CODE.sub("", unit.text))
        targets += [m.group(2) for m in LINK.finditer(text)]
        unit = unit.parent
    return targets


class Checker:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.sources = Sources(root)
        self._sections: dict[Path, dict[str, list[str]]] = {}

    def docs(self) -> list[Path]:
        paths = []
        for pattern in DOCS:
            paths += sorted(self.root.glob(pattern))
        generated = {(self.root / p).resolve() for p in GENERATED_FILES}
        return [p for p in paths if p.resolve() not in generated]

    def sections(self, doc: Path) -> dict[str, list[str]]:
        if doc not in self._sections:
            self._sections[doc] = parse(doc, doc.read_text())[1] if doc.is_file() else {}
        return self._sections[doc]

    def _results_targets(self, doc: Path, targets: list[str], follow: bool = True) -> list[Path]:
        found = []
        for target in targets:
            if re.match(r"^[a-z]+:", target):
                continue  # a URL
            path_part, _, anchor = target.partition("#")
            resolved = (doc.parent / path_part).resolve() if path_part else doc.resolve()
            try:
                relative = resolved.relative_to(self.root)
            except ValueError:
                continue
            if relative.parts[:1] == ("results",) or str(relative) in GENERATED_FILES:
                found.append(resolved)
            elif follow and anchor and resolved.suffix == ".md" and resolved.is_file():
                lines = self.sections(resolved).get(anchor, [])
                inner = [m.group(2) for line in lines for m in LINK.finditer(CODE.sub("", line))]
                found += self._results_targets(resolved, inner, follow=False)
        return found

    def source_files(self, unit: Unit) -> list[Path]:
        files: list[Path] = []
        for target in self._results_targets(unit.path, doc_links(unit)):
            files += [f for f in self.sources.files(target) if f not in files]
        return files

    def check_unit(self, unit: Unit, report: list[str] | None = None) -> list[Problem]:
        found = figures(unit)
        if not found or quotes_its_source(unit):
            return []
        rel = unit.path.resolve().relative_to(self.root) if unit.path.resolve().is_relative_to(self.root) \
            else unit.path
        files = self.source_files(unit)

        def where(value: Decimal, raw: str, unit: str | None = None) -> Path | None:
            return next((f for f in files if self.sources.holds(f, value, raw, unit)), None)

        problems = []
        for f in found:
            if f.unrecorded:
                if report is not None:
                    report.append(f"{rel}:{f.line}: {f.text}: unrecorded (marked in the doc)")
                continue
            if not files:
                problems.append(Problem(str(rel), f.line, f.text, "the unit links no file under results/"))
                continue
            if f.derived is not None:
                try:
                    value, inputs = _evaluate(f.derived)
                except (SyntaxError, ValueError, ZeroDivisionError, InvalidOperation) as e:
                    problems.append(Problem(str(rel), f.line, f.text, f"bad derived expression {f.derived!r}: {e}"))
                    continue
                if not _rounds_to(value, f.value):
                    problems.append(Problem(str(rel), f.line, f.text,
                                            f"derived: {f.derived} = {value:.6g}, not {f.value}"))
                for raw in inputs:
                    v = as_decimal(raw)
                    if v not in UNIT_FACTORS and where(v, raw) is None:
                        problems.append(Problem(str(rel), f.line, f.text,
                                                f"derived input {raw} is in none of the linked files"))
                if report is not None:
                    report.append(f"{rel}:{f.line}: {f.text}: derived ({f.derived})")
                continue
            if f.pair is not None:
                source = next((p for p in files if self.sources.holds_pair(p, *f.pair)), None)
            else:
                source = where(f.value, f.raw, f.unit)
            if source is None:
                names = ", ".join(str(p.relative_to(self.root)) for p in files[:4]) + (
                    f" (+{len(files) - 4} more)" if len(files) > 4 else "")
                problems.append(Problem(str(rel), f.line, f.text, f"in none of the linked files: {names}"))
            elif report is not None:
                report.append(f"{rel}:{f.line}: {f.text}: {source.relative_to(self.root)}")
        return problems

    def check_text(self, path: Path, text: str, report: list[str] | None = None) -> list[Problem]:
        units, sections = parse(path, text)
        self._sections.setdefault(path.resolve(), sections)
        problems = []
        for unit in units:
            problems += self.check_unit(unit, report)
        return problems

    def check(self, report: list[str] | None = None) -> list[Problem]:
        problems = []
        for doc in self.docs():
            problems += self.check_text(doc, doc.read_text(), report)
        return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jf_jax.cli.figures", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: the current one)")
    p.add_argument("--list", action="store_true", help="also list every figure checked and the file it is in")
    args = p.parse_args(argv)
    if not (args.root / "results").is_dir():
        print(f"error: no results/ folder under {args.root}", file=sys.stderr)
        return 2
    report: list[str] | None = [] if args.list else None
    problems = Checker(args.root).check(report)
    for line in report or []:
        print(line)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} figure(s) not matched to a committed file under results/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
