"""Speed runs: every method of an evaluation decodes a prompt set, one prompt after another, after compilation.

Each run is summarized by ``decoding.stats`` under its schema names (TPF as a ratio of totals and as a per-prompt
mean with its bootstrap interval, tokens/s with and without the prefill), every answer is scored by
``answer_quality`` (its repeat fraction and whether it loops), and the runs of one set are compared with the AR
run of the same set in the same process: ``speedup_vs_ar`` and ``match_ar``.
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
    """One timed run: ``stats.summarize_with_loops`` of its per-prompt records (the decoder's, with each answer's
    ``repeat_fraction`` and ``loops``), the records, and the generated tokens."""
    from jf_jax.api import METHODS
    from jf_jax.decoding.stats import summarize_with_loops
    from jf_jax.eval.answer_quality import answer_quality

    decode = METHODS[method]
    eos = model.tokenizer.eos_ids
    # Every method decodes one prompt at a time (batch_size 1, the default), so each prompt's timing is its own.
    r = decode(model.params, model.cfg, prompts, max_new_tokens=max_new_tokens, eos_ids=eos, batch_size=1,
               **options)
    per_prompt = [dict(p, **answer_quality(ids, p["stop_reason"]))
                  for p, ids in zip(r.stats["per_prompt"], r.token_ids)]
    return dict(method=method, **summarize_with_loops(per_prompt), per_prompt=per_prompt, token_ids=r.token_ids)


def speed_of_set(model, prompts, runs: list[SpeedRun], *, max_new_tokens: int, seed: int, sampling, decode_shape,
                 mesh) -> dict[str, dict]:
    """Every run of ``runs`` on the encoded ``prompts``, by row name, each with its ``block_size``; with an AR run
    among them, each run's ``match_ar`` and its speedups over AR (``stats.add_speedups``). ``seed``, ``sampling``
    (a ``decoding.sampling.Sampling``), ``decode_shape`` (``api.run_shape``'s) and ``mesh`` are every run's."""
    from jf_jax.decoding.stats import add_speedups, match_fraction

    per_run = {}
    for run in runs:
        per_run[run.name] = speed_run(model, run.method, prompts, max_new_tokens=max_new_tokens,
                                      options=dict(run.options, seed=seed, sampling=sampling,
                                                   decode_shape=decode_shape, mesh=mesh))
        per_run[run.name]["block_size"] = run.options.get("block_size")
    if "ar" in per_run:
        for m in per_run.values():
            m["match_ar"] = match_fraction(m["token_ids"], per_run["ar"]["token_ids"])
    return add_speedups(per_run)
