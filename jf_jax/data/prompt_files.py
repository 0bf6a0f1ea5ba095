"""Prompts given on a command line: files of prompts (``.jsonl`` with a ``prompt`` field, or ``.txt``, one per
line) and the built-in prompts every CLI falls back to. Shared by the decoding CLI and the tuner's, so neither
CLI imports the other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

BUILTIN_PROMPTS = (
    "Write a Python function `is_prime(n)` that returns True if n is a prime number.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Give me three tips for staying focused while studying.",
)


def prompt_rows(text: str, path) -> list[dict]:
    """The rows of a prompts JSONL text, each an object with a non-empty string "prompt"; a ValueError names
    ``path`` and the line (1-based, blank lines counted) of the first bad row. Every command reads prompt files
    through here, so each names a bad row alike."""
    rows = []
    for n, line in enumerate(text.split("\n"), 1):  # split on newlines only, as json.dumps never writes one
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{n} has no string 'prompt' field")
        if not row["prompt"].strip():
            raise ValueError(f"{path}:{n} has an empty 'prompt'")
        rows.append(row)
    return rows


def read_prompt_file(path: Path) -> list[str]:
    """The prompts of a ``.jsonl`` or ``.txt`` file; a ValueError names the file (and line) of any problem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    prompts = []
    if path.suffix == ".jsonl":
        prompts.extend(row["prompt"] for row in prompt_rows(text, path))
    elif path.suffix == ".txt":
        prompts.extend(lines)
    else:
        raise ValueError(f"prompts file {path} must end in .jsonl or .txt")
    if not lines:
        raise ValueError(f"prompts file {path} holds no prompts")
    return prompts


def gather_prompts(inline: Sequence[str], path: Path | None, limit_builtin: int | None = None) -> list[str]:
    """``inline`` prompts then the file's; the built-in prompts (the first ``limit_builtin``) when both are empty."""
    prompts = list(inline) + (read_prompt_file(path) if path is not None else [])
    return prompts or list(BUILTIN_PROMPTS[:limit_builtin])
