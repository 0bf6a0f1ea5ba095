"""Which prompt goes where: the held-out sets first, then the training pool, deduplicated and disjoint from them.

Held-out sets grow without changing what was held out before, so every earlier evaluation stays comparable, and
what they add was in no earlier training file (``build.legacy_rows``; the earlier train.jsonl did hold one of the
first 48 word for word, ntpath.lexists reading as the held-out posixpath.lexists):

* code: the 48 tasks the seeded split of ``code_prompts.STDLIB_MODULES`` always held out, then extra tasks drawn
  (seeded) from pure-Python standard-library functions that no earlier training file had: a name that is not
  the name of any task of ``STDLIB_MODULES`` or ``EXTRA_STDLIB_MODULES``, nor a HumanEval entry point;
* math: the originals of the held-out GSM templates (split by template, as before), then generated variants of
  those same templates, one per template in turn. No variant of a held-out template is ever trained on.

The training pool's code prompts are ``library_tasks``' functions, in ``SOURCES`` order, each kept only when its
name, its description and its prompt text are new: no earlier kept task, no held-out task, no HumanEval entry
point has them (one ``mean``, not numpy's and jax's, and no alias under another name). Its math
prompts are the originals and seeded variants of the training templates, without repeated questions.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from jf_jax.data import code_prompts, gsm

LEGACY_CODE_HELDOUT = 48
"""The size of the held-out code set before it grew; its tasks stay the first ones held out."""


@dataclasses.dataclass(frozen=True)
class CodeSplit:
    heldout: list[code_prompts.CodeTask]
    legacy_train: list[code_prompts.CodeTask]
    """The tasks of STDLIB_MODULES not held out: the code part of the earlier train.jsonl."""
    legacy_heldout: list[code_prompts.CodeTask]
    """The first ``min(count, 48)`` held-out tasks, those earlier builds held out."""


def split_indices(count: int, heldout: int, seed: int, salt: int) -> tuple[list[int], list[int]]:
    """(train, held-out) index lists, each sorted, from a seeded permutation of ``range(count)``. The held-out
    set of a larger ``heldout`` contains the smaller one's (both take a prefix of the same permutation)."""
    heldout = min(max(heldout, 0), count)
    perm = np.random.default_rng([seed, salt]).permutation(count)
    return sorted(perm[heldout:].tolist()), sorted(perm[:heldout].tolist())


def library_code_task(row: dict) -> code_prompts.CodeTask:
    return code_prompts.CodeTask(module=row["module"], name=row["name"], signature=row["signature"], doc=row["doc"],
                                 source=row["source"])


def split_code(legacy_tasks, old_names: set[str], stdlib_rows: list[dict], count: int, seed: int,
               exclude_names: set[str]) -> CodeSplit:
    """The held-out code tasks (module docstring). ``legacy_tasks``: ``stdlib_tasks(STDLIB_MODULES)``;
    ``old_names``: the names of every task an earlier training file may hold; ``stdlib_rows``: ``library_tasks``'
    standard-library tasks, where the extra held-out tasks come from."""
    legacy_tr, legacy_ho = split_indices(len(legacy_tasks), min(count, LEGACY_CODE_HELDOUT), seed, 1)
    legacy_heldout = [legacy_tasks[i] for i in legacy_ho]
    extra = max(count - len(legacy_heldout), 0)
    # pure-Python functions only: the C builtins left over are mostly system calls (posix, curses)
    candidates = [library_code_task(r) for r in stdlib_rows
                  if not r["builtin"] and r["name"] not in old_names and r["name"] not in exclude_names]
    picked = sorted(np.random.default_rng([seed, 5]).permutation(len(candidates))[:extra].tolist())
    extras, names = [], set()
    for i in picked:
        if candidates[i].name not in names:
            names.add(candidates[i].name)
            extras.append(candidates[i])
    return CodeSplit(heldout=legacy_heldout + extras, legacy_train=[legacy_tasks[i] for i in legacy_tr],
                     legacy_heldout=legacy_heldout)


def code_pool(rows_by_source: dict[str, list[dict]], heldout, exclude_names: set[str]):
    """(training code tasks, {reason: dropped count}); ``rows_by_source`` in priority order."""
    blocked = {t.name for t in heldout} | set(exclude_names)
    names = set(blocked)
    docs = {t.doc for t in heldout}
    prompts = {t.prompt for t in heldout}
    kept, dropped = [], collections.Counter()
    for rows in rows_by_source.values():
        for row in rows:
            task = library_code_task(row)
            reason = ("heldout_or_humaneval_name" if task.name in blocked else "duplicate_name" if task.name in names
                      else "duplicate_description" if task.doc in docs
                      else "duplicate_prompt" if task.prompt in prompts else None)
            if reason:
                dropped[reason] += 1
                continue
            names.add(task.name)
            docs.add(task.doc)
            prompts.add(task.prompt)
            kept.append(task)
    return kept, dict(sorted(dropped.items()))


def split_math(originals, held_templates: int, heldout: int, seed: int, wheel: str, max_attempts: int):
    """(training originals, held-out problems): the held-out templates' originals, then variants of those
    templates in turn (variant 1 of each, then 2, ...) up to ``heldout`` problems."""
    tr, ho = split_indices(len(originals), held_templates, seed, 2)
    held = [originals[i] for i in ho]
    need = heldout - len(held)
    if need > 0 and held:
        per_template = -(-need // len(held))
        variants = [gsm.generate_variants(wheel, p.template, per_template, seed, max_attempts=max_attempts)
                    for p in held]
        seen = {p.question for p in held}
        for k in range(per_template):
            for vs in variants:
                if need > 0 and k < len(vs) and vs[k].question not in seen:
                    seen.add(vs[k].question)
                    held.append(vs[k])
                    need -= 1
    return [originals[i] for i in tr], held


def math_pool(train_originals, heldout, variants: int, seed: int, wheel: str, max_attempts: int, progress=None):
    """Each training template's original, then its seeded variants; a question already kept (or held out) is
    dropped. ``progress`` wraps the template iterator (a tqdm)."""
    seen = {p.question for p in heldout}
    held_templates = {p.template for p in heldout}
    out = []
    for p in (progress or iter)(train_originals):
        assert p.template not in held_templates, "a held-out template in the training split"
        for q in [p, *gsm.generate_variants(wheel, p.template, variants, seed, max_attempts=max_attempts)]:
            if q.question not in seen:
                seen.add(q.question)
                out.append(q)
    return out
