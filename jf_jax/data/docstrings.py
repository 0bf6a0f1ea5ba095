"""A library function's docstring cut down to a task description: what a "write this function" prompt shows.

Library docstrings are long reference pages (numpy / Google / Sphinx sections, doctests, ``.. math::`` blocks,
cross-reference roles). A prompt keeps the description paragraphs before the first section and, when it still
fits in ``max_chars``, the parameters and returns sections whole: a section cut in the middle would describe
some arguments and not others. ``describe`` returns None for a docstring that makes no usable task: too short,
a first paragraph longer than the budget (no clean place to cut), a deprecated function, or an alias whose whole
text is a pointer to another function.
"""

from __future__ import annotations

import inspect
import re
import textwrap

# Headers that end the description. Numpy style underlines the header (next line of dashes or equals signs);
# Google style ends it with a colon; Sphinx fields (":param x:") and doctests (">>>") end it as well.
_SECTIONS = ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters",
             "returns", "return", "yields", "yield", "raises", "raise", "examples", "example", "example usage",
             "usage", "notes", "note", "see also", "references", "attributes", "warnings", "warning", "warns",
             "todo", "methods", "type parameters", "shape", "inputs", "outputs", "algorithm", "tip")
_KEPT = {"args": "Args", "arguments": "Args", "parameters": "Args", "params": "Args", "returns": "Returns",
         "return": "Returns", "yields": "Yields", "yield": "Yields"}
_UNDERLINE = re.compile(r"^\s*(-{3,}|={3,})\s*$")
_FIELD = re.compile(r"^\s*:(param|parameter|arg|argument|key|keyword|type|return|returns|rtype|raises|raise|"
                    r"ivar|cvar|var|yield|yields)\b")
_DEPRECATED = re.compile(r"deprecat|will be removed|no longer supported|legacy alias", re.IGNORECASE)
_CALL_LINE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")
_DEPRECATED_DIRECTIVE = re.compile(r"^\s*\.\. deprecated::", re.MULTILINE)
_POINTER = re.compile(r"^(an? )?(alias|synonym|shorthand|shortcut)\b|^(see|same as|equivalent to|refer to|"
                      r"wrapper (around|for)|copied from|don'?t use|do not use)\b", re.IGNORECASE)

# Markup that reads badly in a prompt: Sphinx roles (:func:`~numpy.mean` -> `numpy.mean`, a title kept over its
# target), double backticks, link targets, footnote references and Markdown cross-references ([`Foo`]).
_ROLE = re.compile(r":(?:[\w.-]+:)*[\w-]+:`~?([^`]+)`")
_TITLED = re.compile(r"^(.*?)\s*<[^<>]+>$", re.DOTALL)
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`_{1,2}")
_FOOTNOTE = re.compile(r"\s*\[(\w+|#\w*|\*)\]_")
_MD_REF = re.compile(r"\[`([^`\]]+)`\](\([^)]*\))?")


def _role(match: re.Match) -> str:
    body = match.group(1)
    titled = _TITLED.match(body)
    return f"`{(titled.group(1) if titled else body).strip()}`"


def clean_markup(text: str) -> str:
    text = _ROLE.sub(_role, text)
    text = _LINK.sub(r"\1", text)
    text = text.replace("``", "`").replace("\\ ", "")
    text = _FOOTNOTE.sub("", text)
    return _MD_REF.sub(r"`\1`", text)


def _header(lines: list[str], i: int) -> str | None:
    """The section name starting at line ``i`` (lower case), or None."""
    line = lines[i].strip()
    if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]) and line and not _UNDERLINE.match(line):
        return line.lower()
    if line.endswith(":") and line.rstrip(":").strip().lower() in _SECTIONS:
        return line.rstrip(":").strip().lower()
    return None


def split_sections(doc: str) -> tuple[list[str], dict[str, str]]:
    """(description paragraphs, {kept section name: its text}) of a cleaned docstring. Directive blocks
    (``.. note::`` and their indented body) are dropped; the description ends at the first header, Sphinx
    field or doctest."""
    lines = doc.splitlines()
    description: list[str] = []
    sections: dict[str, str] = {}
    paragraph: list[str] = []
    i, in_description, current = 0, True, None
    while i < len(lines):
        line = lines[i]
        name = _header(lines, i)
        stripped = line.strip()
        if name is not None or _FIELD.match(line) or stripped.startswith(">>>"):
            in_description = False
            current = _KEPT.get(name) if name is not None else None
            if current is not None and current not in sections:
                sections[current] = ""
            elif current is not None:
                current = None  # a second Args section (an overload): keep the first only
            i += 2 if name is not None and i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]) else 1
            continue
        if stripped.startswith(".. "):
            # a directive: dropped with its indented body, except a formula (``.. math::``), kept as its lines
            keep = stripped.startswith(".. math::") and in_description
            formula = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                if keep and lines[i].strip():
                    formula.append(lines[i])
                i += 1
            if formula:
                if paragraph:
                    description.append("\n".join(paragraph).strip())
                    paragraph = []
                description.append(textwrap.dedent("\n".join(formula)).strip())
            continue
        if in_description:
            if stripped:
                paragraph.append(line)
            elif paragraph:
                description.append("\n".join(paragraph).strip())
                paragraph = []
        elif current is not None:
            sections[current] += line + "\n"
        i += 1
    if in_description and paragraph:
        description.append("\n".join(paragraph).strip())
    sections = {k: textwrap.indent(textwrap.dedent(v).strip("\n").rstrip(), "    ")
                for k, v in sections.items() if v.strip()}
    return description, sections


def describe(doc: str | None, *, min_chars: int = 40, max_chars: int = 900) -> str | None:
    """The task text of a docstring, or None when it makes no usable task (see the module docstring)."""
    if not doc:
        return None
    doc = inspect.cleandoc(doc)
    if _DEPRECATED_DIRECTIVE.search(doc):
        return None
    description, sections = split_sections(clean_markup(doc))
    if _DEPRECATED.search("\n".join(description)):
        return None
    # a C function's docstring may open with its call ("name(a, b) -> list"): the prompt shows the signature
    while description and _CALL_LINE.match(description[0].splitlines()[0]):
        description[0] = "\n".join(description[0].splitlines()[1:]).strip()
        description = [p for p in description if p]
    # an introduction to the doctests that were cut ("For example:") would dangle
    while description and description[-1].rstrip().endswith(":"):
        description.pop()
    if not description or len(description[0]) > max_chars or _POINTER.match(description[0]):
        return None
    out = description[0]
    for p in description[1:]:
        if len(out) + len(p) + 2 > max_chars:
            break
        out = f"{out}\n\n{p}"
    if len(out) < min_chars:
        return None
    for name in ("Args", "Returns", "Yields"):
        if name in sections:
            block = f"{name}:\n{sections[name]}"
            if len(out) + len(block) + 2 > max_chars:
                break  # Returns without the Args before it would read as if there were no arguments
            out = f"{out}\n\n{block}"
    return out
