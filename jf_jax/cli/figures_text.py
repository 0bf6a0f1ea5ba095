"""README.md and docs/*.md read as the figure check sees them: units (a paragraph, a list item, a table row), their
links, and the figures in their prose (the rules are in ``jf_jax.cli.figures``' docstring)."""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal
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
SOURCE_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d|,\d)|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_RANGE_JOIN = re.compile(r"(?:\s?[-–]\s?|\s(?:to)\s)$")
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
CODE = re.compile(r"(`+)(.+?)\1", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
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
    text = LINK.sub(lambda m: m.group(1), heading).replace("`", "").strip().lower()
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


def as_decimal(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def _clean(text: str) -> tuple[str, list[tuple[int, str, str | None]]]:
    """The unit's prose with code, comments and link targets blanked (offsets kept), and its markers
    (offset, kind, expression)."""
    for pattern in (COMMENT, CODE):
        for m in list(pattern.finditer(text)):
            text = _blank(text, m.start(), m.end())
    for m in list(LINK.finditer(text)):
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
        found.append(Figure(label, as_decimal(raw), line_of(start), start, g, raw=raw, unit=u))
    seen = {f.start for f in found}
    for pattern in (_RATIO_OF, _RATIO_SLASH):
        for m in pattern.finditer(text):
            if m.start(1) not in seen and m.start(2) not in seen:
                seen.update((m.start(1), m.start(2)))
                group += 1
                found.append(Figure(m.group(0), as_decimal(m.group(1)), line_of(m.start(1)), m.start(1), group,
                                    pair=(as_decimal(m.group(1)), as_decimal(m.group(2))), raw=m.group(1)))
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
