"""A second quality check of greedy AR answers, read from an evaluation's result (no decoding): for every prompt of
the code set (the held-out "write this function" tasks), whether the AR answer has a closed ```python block,
whether the block parses (``ast.parse``) and whether it defines the requested function (``def NAME``). A 135M
model scores near zero on GSM8K, so this is where a fine-tune that damages the model would show first.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Callable, Sequence

from jf_jax.eval.code_execution import FENCE  # one rule for what a fenced code block is
CHECKS = ("closed_block", "parses", "defines")
"""What ``check_answer`` asks of an answer, in the order the table shows it."""


@dataclasses.dataclass(frozen=True)
class CodeQuality:
    """One model's AR answers on the code set: how many were checked, and how many pass each of ``CHECKS``."""

    model: str
    answers: int
    closed_block: int
    parses: int
    defines: int


def check_answer(text: str, name: str) -> dict:
    blocks = FENCE.findall(text)
    parses = False
    defines = False
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        parses = True
        defines = defines or any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                                 for n in ast.walk(tree))
    return dict(closed_block=bool(blocks), parses=parses, defines=defines)


def function_name(prompt: str) -> str:
    match = re.search(r"function `([A-Za-z_][A-Za-z0-9_]*)\(", prompt)
    return match.group(1) if match else ""


def code_quality(result: dict, set_name: str, rows: Sequence[dict], decode: Callable[[list[int]], str]
                 ) -> list[CodeQuality]:
    """Per model of ``result`` (an evaluation's OUT.json), the checks of its AR answers on the prompt set
    ``set_name``, whose ``rows`` (the prompts, in order) name the requested functions; ``decode`` turns an
    answer's token ids into its text."""
    scores = []
    for res in result["results"]:
        ar = res["speed"][set_name]["ar"]
        checks = [check_answer(decode(ids), function_name(row["prompt"])) for ids, row in zip(ar["token_ids"], rows)]
        scores.append(CodeQuality(res["model"], len(checks), *(sum(c[k] for c in checks) for k in CHECKS)))
    return scores
