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
import dataclasses
import operator
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

DOCS = ("README.md", "docs/*.md")
"""The docs checked, relative to the repository root."""
GENERATED_FILES = ("docs/results.md",)
"""Written whole by ``jf_jax.cli.results`` from the run folders (its ``--check`` guards them): not checked here,
and a source like a results file (a figure may cite the index, whose every number comes from results/)."""
GENERATED_SPANS = (("<!-- results-table:start -->", "<!-- results-table:end -->"),)
"""Spans of a doc written by ``jf_jax.cli.results`` (README's headline table)."""
SOURCE_SUFFIXES = {".md", ".json", ".jsonl", ".txt", ".log", ".yaml", ".csv"}
"""The text files a figure may come from (a folder link takes only its .md, .json and .txt files)."""
FOLDER_SUFFIXES = {".md", ".json", ".txt"}
RAW_SUFFIXES = {".json", ".jsonl"}
"""Files of raw recorded values (full-precision floats), which a figure may quote rounded; in the others a number
is written as it was meant to be read, and the figure must be that number."""
UNIT_SYNONYMS = {"x": "x|×", "min": "min|minutes?", "minutes": "min|minutes?", "s": "s|seconds?",
                 "seconds": "s|seconds?", "tok/s": "tok/s|tokens/s", "tokens/s": "tok/s|tokens/s", "%": "%| percent"}
"""Units one figure may carry in the doc and another in its source."""
UNIT_FACTORS = {Decimal(100), Decimal(1000), Decimal(1024), Decimal(60)}
"""Numbers a derived expression may use as unit factors without a source (percent, kilo, kibi, minutes)."""

UNITS = (r"tok/s|tokens/s|tokens per second|responses/s|prompts/s|steps/s|blocks/s|TFLOP/s|PFLOP/s|TB/s|GB/s|MB/s"
         r"|Gbps|GiB|MiB|KiB|GB|MB|KB|TB|ms|µs|min|minutes|seconds|hours|CPU-seconds|CPU-minutes|test-seconds"
         r"|nats|s|%")
_UNIT_AFTER = re.compile(rf"\s?({UNITS})(?![\w/])")
_TIMES_AFTER = re.compile(r"[x×](?![\w])")  # written against the number: 1.46x; 4x128 is a shape
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE]-\d+)?")
_SOURCE_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d|,\d)|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_RANGE_JOIN = re.compile(r"(?:\s?[-–]\s?|\s(?:to)\s)$")
_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_MARKER = re.compile(r"\((derived|unrecorded)(?::\s*([^)]*(?:\([^)]*\)[^)]*)*))?\)")
_IDENTIFIERS = re.compile(
    r"arXiv\s+\d+\.\d+"  # a paper's id
    r"|\b\d+\.\d+\.\d+(?:\.\d+)*\b"  # a version: 0.10.2
    r"|\b(?:Python|python|jax|JAX|jaxlib|CUDA|libtpu|torch|transformers|version|v)\s?\d+(?:\.\d+)+"
    r"|(?<=[A-Za-z])(?<!\d[eE])-\d+(?:\.\d+)*"  # inside a name: Llama-3.1, Qwen2.5-Coder-0.5B (not 1.5e-4)
    r"|[\w.]*\d/\d+(?:\.\d+)+[\w/.]*|[\w.]*\d+\.\d+/[\w/.]*"  # families and paths: Qwen2/2.5/3
    r"|\b(?:Llama|Qwen|SmolLM|Gemma|Mistral)\s\d+(?:\.\d+)*"  # a model family's version: Llama 3.1
)
_SENTENCE_END = re.compile(r"[.!?]\s+(?=[A-Z(`*\[])")
_SETTING = re.compile(r"(?<!\d )\b[A-Za-z_]\w*\s?=\s?$")  # r = 0.85: a setting (not 143,771 MiB = 140.4 GiB)
_COUNT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_RATIO_OF = re.compile(rf"(?<![\w.,])({_COUNT})\s+of\s+({_COUNT})(?!\w|[.,]\d)")
_RATIO_SLASH = re.compile(r"(?<![\w./])(\d+)/(\d+)(?![\w/]|\.\d)")


@dataclasses.dataclass
class Figure:
    """One number of a unit that must come from a linked file."""
    text: str  # as written, with its unit
    value: Decimal
    line: int
    start: int  # offset in the unit's text
    group: int  # numbers of one range share a group
    derived: str | None = None
    unrecorded: bool = False
    pair: tuple[Decimal, Decimal] | None = None  # a ratio of counts, N of M or N/M: (N, M)
    raw: str = ""  # the number as written
    unit: str | None = None


@dataclasses.dataclass
class Unit:
    """A paragraph, list item or table row: its lines, its links and the unit that introduces it."""
    path: Path
    line: int
    lines: list[str]
    kind: str  # "paragraph", "item", "row"
    indent: int = 0
    parent: "Unit | None" = None
    header: str | None = None  # a table row's: the table's first row

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclasses.dataclass
class Problem:
    path: str
    line: int
    figure: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.figure}: {self.reason}"


# ---------------------------------------------------------------------------------------------------- parsing


_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = _LINK.sub(lambda m: m.group(1), heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _blank_generated(lines: list[str]) -> list[str]:
    out, inside = [], False
    for line in lines:
        for start, end in GENERATED_SPANS:
            if start in line:
                inside = True
            if end in line:
                inside = False
                line = ""
        out.append("" if inside else line)
    return out


def parse(path: Path, text: str) -> tuple[list[Unit], dict[str, list[str]]]:
    """The units of a doc, and for each section anchor the lines of that section (sub-sections included)."""
    lines = _blank_generated(text.splitlines())
    units: list[Unit] = []
    headings: list[tuple[int, int, str]] = []  # (line index, level, slug)
    code_lines: set[int] = set()
    in_fence = False
    current: Unit | None = None  # the unit a plain line continues
    items: list[Unit] = []  # open list items, outermost first
    last_top: Unit | None = None  # the last unit outside any list item since the heading

    def introducer(kind: str) -> Unit | None:
        """A list's or table's introducing paragraph: the paragraph right before it (a list or table that goes
        on keeps the one it started with)."""
        if last_top is None:
            return None
        if last_top.kind == kind:
            return last_top.parent
        return last_top if last_top.kind == "paragraph" else None

    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
            code_lines.add(i)
            current = None
            continue
        if in_fence:
            code_lines.add(i)
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:
            current = None
            continue
        heading = _HEADING.match(line)
        if heading and indent < 4:
            headings.append((i, len(heading.group(1)), slug(heading.group(2))))
            current, items, last_top = None, [], None
            continue
        item = _ITEM.match(line)
        if stripped.startswith("|"):
            while items and indent < items[-1].indent + 2:
                items.pop()
            unit = Unit(path, i + 1, [line], "row", indent, items[-1] if items else introducer("row"))
            previous_row = units[-1] if units and units[-1].kind == "row" and units[-1].line == i else None
            unit.header = previous_row.header if previous_row else line
            units.append(unit)
            if not items:
                last_top = unit
            current = None
        elif item:
            marker_indent = len(item.group(1))
            while items and items[-1].indent >= marker_indent:
                items.pop()
            unit = Unit(path, i + 1, [line], "item", marker_indent, items[-1] if items else introducer("item"))
            units.append(unit)
            if not items:
                last_top = unit
            items.append(unit)
            current = unit
        elif current is not None:
            current.lines.append(line)
        else:
            while items and indent < items[-1].indent + 2:
                items.pop()
            unit = Unit(path, i + 1, [line], "paragraph", indent, items[-1] if items else None)
            units.append(unit)
            if not items:
                last_top = unit
            current = unit
    sections: dict[str, list[str]] = {}
    for k, (i, level, anchor) in enumerate(headings):
        end = next((j for j, lvl, _ in headings[k + 1:] if lvl <= level), len(lines))
        sections.setdefault(anchor, [lines[j] for j in range(i, end) if j not in code_lines])
    return units, sections


# ---------------------------------------------------------------------------------------------------- figures


def _blank(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def _decimal(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def _clean(text: str) -> tuple[str, list[tuple[int, str, str | None]]]:
    """The unit's prose with code, comments and link targets blanked (offsets kept), and its markers
    (offset, kind, expression)."""
    for pattern in (_COMMENT, _CODE):
        for m in list(pattern.finditer(text)):
            text = _blank(text, m.start(), m.end())
    for m in list(_LINK.finditer(text)):
        text = _blank(text, m.start(2) - 1, m.end())
    markers = []
    for m in list(_MARKER.finditer(text)):
        markers.append((m.start(), m.group(1), m.group(2)))
        text = _blank(text, m.start(), m.end())
    for m in list(_IDENTIFIERS.finditer(text)):
        text = _blank(text, m.start(), m.end())
    return text, markers


def figures(unit: Unit) -> list[Figure]:
    """Every figure of a unit, with its markers applied."""
    text, markers = _clean(unit.text)
    starts = [0]
    for line in unit.lines:
        starts.append(starts[-1] + len(line) + 1)

    def line_of(offset: int) -> int:
        return unit.line + max(k for k, s in enumerate(starts) if s <= offset)

    numbers = []  # (start, end, text, unit or None, is_decimal)
    for m in _NUMBER.finditer(text):
        start, end = m.span()
        after = text[end:]
        if after[:1] == "/" and re.match(r"/\d", after) and "." in m.group():
            continue
        if after[:1].isalpha() or after[:1] == "_":
            if _TIMES_AFTER.match(after):
                numbers.append((start, end + 1, m.group(), "x", True))
            continue  # 7B, 135M, 80GB, 4x128: part of a name or a shape
        if after[:1] == "×":
            numbers.append((start, end + 1, m.group(), "x", True))
            continue
        if _SETTING.search(text[:start]):
            continue
        unit_match = _UNIT_AFTER.match(after)
        u = unit_match.group(1) if unit_match else None
        numbers.append((start, end + (unit_match.end() if unit_match else 0), m.group(), u,
                        "." in m.group() or "e-" in m.group().lower()))
    entries = []  # (start, raw, unit, is_decimal, group)
    group, previous_end = 0, None
    for start, end, raw, u, is_decimal in numbers:
        between = text[previous_end:start] if previous_end is not None else ""
        if previous_end is None or not _RANGE_JOIN.search(between) or between.strip("-– to"):
            group += 1  # not the far end of a range (19-26 min, 0.25 to 0.75)
        entries.append((start, raw, u, is_decimal, group))
        previous_end = end
    group_unit = {g: u for _, _, u, _, g in entries if u is not None}  # a range's unit is its last number's
    found: list[Figure] = []
    for start, raw, u, is_decimal, g in entries:
        u = u or group_unit.get(g)
        if u is None and not is_decimal:
            continue  # a whole number without a unit: a count, a size, a date
        label = raw if u is None else (f"{raw}{u}" if u in ("x", "%") else f"{raw} {u}")
        found.append(Figure(label, _decimal(raw), line_of(start), start, g, raw=raw, unit=u))
    seen = {f.start for f in found}
    for pattern in (_RATIO_OF, _RATIO_SLASH):
        for m in pattern.finditer(text):
            if m.start(1) not in seen and m.start(2) not in seen:
                seen.update((m.start(1), m.start(2)))
                group += 1
                found.append(Figure(m.group(0), _decimal(m.group(1)), line_of(m.start(1)), m.start(1), group,
                                    pair=(_decimal(m.group(1)), _decimal(m.group(2))), raw=m.group(1)))
    found.sort(key=lambda f: f.start)
    for offset, kind, expression in markers:
        before = [f for f in found if f.start < offset]
        if not before:
            continue
        last = [f for f in before if f.group == before[-1].group]
        if kind == "unrecorded":  # every figure of its sentence before it
            sentence = max((m.end() for m in _SENTENCE_END.finditer(text, 0, offset)), default=0)
            for f in before:
                if f.start >= sentence and f.derived is None:
                    f.unrecorded = True
        else:
            parts = [p.strip() for p in (expression or "").split(";")]
            for k, f in enumerate(last):
                f.derived = parts[k] if k < len(parts) else ""
    return found


# ---------------------------------------------------------------------------------------------------- sources


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
            self._lines[path] = [[_decimal(t.group()) for t in _SOURCE_NUMBER.finditer(line)
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
        for m in _SOURCE_NUMBER.finditer(path.read_text(errors="replace")):
            try:
                value = _decimal(m.group())
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
        text = _COMMENT.sub("", _CODE.sub("", unit.text))
        targets += [m.group(2) for m in _LINK.finditer(text)]
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
                inner = [m.group(2) for line in lines for m in _LINK.finditer(_CODE.sub("", line))]
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
                    v = _decimal(raw)
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
