"""Speed runs: every method of an evaluation decodes a prompt set, one prompt after another, after compilation.

Each run is summarized by ``decoding.stats`` under its schema names (TPF as a ratio of totals and as a per-prompt
mean with its bootstrap interval, tokens/s with and without the prefill), every answer is scored by
``answer_quality`` (its repeat fraction and whether it loops), and the runs of one set are compared with the AR
run of the same set in the same process: ``speedup_vs_ar`` and ``match_ar``. A run's cell is a pure function of its
per-prompt records (``run_summary``), so a multi-process evaluation's parts merge into the one-process cell.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpeedRun:
    """One timed run of an evaluation: its row name in the tables, its method and the method's options."""

    name: str
    method: str
    """A key of ``api.METHODS``."""
    options: dict
    """Keyword options of ``api.METHODS[method]`` (block size, blocks in flight) that name this run."""


def speed_runs(methods, block_sizes, num_blocks: int) -> list[SpeedRun]:
    """Every timed run: AR once, jacobi / mr once per block size (mr with ``num_blocks`` blocks in flight)."""
    runs = []
    for method in methods:
        if method == "ar":
            runs.append(SpeedRun("ar", "ar", {}))
            continue
        extra = dict(num_blocks=num_blocks) if method == "mr" else {}
        runs += [SpeedRun(f"{method} n={n}", method, dict(block_size=n, **extra)) for n in block_sizes]
    return runs


def speed_run(model, method: str, prompts, *, max_new_tokens: int, options: dict) -> dict:
    """One timed run: ``run_summary`` of its per-prompt records (the decoder's, with each answer's
    ``repeat_fraction`` and ``loops``) and its generated tokens."""
    from jf_jax.api import METHODS
    from jf_jax.eval.answer_quality import answer_quality

    decode = METHODS[method]
    eos = model.tokenizer.eos_ids
    # Every method decodes one prompt at a time (batch_size 1, the default), so each prompt's timing is its own.
    r = decode(model.params, model.cfg, prompts, max_new_tokens=max_new_tokens, eos_ids=eos, batch_size=1,
               **options)
    per_prompt = [dict(p, **answer_quality(ids, p["stop_reason"]))
                  for p, ids in zip(r.stats["per_prompt"], r.token_ids)]
    return run_summary(method, options.get("block_size"), per_prompt, r.token_ids)


def run_summary(method: str, block_size: int | None, per_prompt: list[dict], token_ids: list[list[int]]) -> dict:
    """A run's cell of the report: ``stats.summarize_with_loops`` of its per-prompt records, the records and the
    generated tokens. A pure function of the records, so the union of a multi-process run's parts is summarized
    as one process's run is (``eval.parts``)."""
    from jf_jax.decoding.stats import summarize_with_loops

    return dict(method=method, **summarize_with_loops(per_prompt), per_prompt=per_prompt, token_ids=token_ids,
                block_size=block_size)


def compare_with_ar(per_run: dict[str, dict]) -> dict[str, dict]:
    """With an AR run among ``per_run`` (cells by row name), each run's ``match_ar`` and its speedups over AR
    (``stats.add_speedups``)."""
    from jf_jax.decoding.stats import add_speedups, match_fraction

    if "ar" in per_run:
        for m in per_run.values():
            m["match_ar"] = match_fraction(m["token_ids"], per_run["ar"]["token_ids"])
    return add_speedups(per_run)


def speed_of_set(model, prompts, runs: list[SpeedRun], *, max_new_tokens: int, seed: int, sampling, decode_shape,
                 mesh, first_index: int = 0) -> dict[str, dict]:
    """Every run of ``runs`` on the encoded ``prompts``, by row name, compared with AR's (``compare_with_ar``).
    ``seed``, ``sampling`` (a ``decoding.sampling.Sampling``), ``decode_shape`` (``api.run_shape``'s) and ``mesh``
    are every run's; ``first_index`` is the index of the first prompt in its whole set (a process's share of a
    multi-process run), which keys each prompt's drafts and sampling as the one-process run keys them."""
    per_run = {}
    for run in runs:
        per_run[run.name] = speed_run(model, run.method, prompts, max_new_tokens=max_new_tokens,
                                      options=dict(run.options, seed=seed, sampling=sampling,
                                                   decode_shape=decode_shape, mesh=mesh, first_index=first_index))
    return compare_with_ar(per_run)
