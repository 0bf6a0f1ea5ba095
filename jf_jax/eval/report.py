"""An evaluation's report: OUT.json (the run's settings and every model's result) and OUT.md (its tables).

Both files are replaced whole after each model, so a late failure loses only the model it hit, and OUT.json is
read back to resume (``read_report``). The speed table is drawn by ``stats_table`` from the ``decoding.stats``
keys of each run's summary; the quality tables are this module's own.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

SPEED_COLUMNS = ("model", "set", "method", "prompts", "tpf", "mean_tpf", "mean_tpf_ci95", "loop_rate",
                 "without_loops.prompts", "without_loops.mean_tpf", "without_loops.mean_tpf_ci95", "tokens_per_second",
                 "tokens_per_second_excl_prefill", "speedup_vs_ar", "speedup_vs_ar_excl_prefill", "match_ar")
"""The speed table's columns: ``decoding.stats`` keys, rendered by ``eval.stats_table``."""


def device_name() -> str:
    """The machine the speed runs are measured on, as the report names it."""
    import jax

    from jf_jax.model.machine import cpu_kind

    device = jax.devices()[0]
    return f"CPU: {cpu_kind()}" if device.platform == "cpu" else device.device_kind


def speed_rows(results: list[dict]) -> list[dict]:
    """One table row per (model, prompt set, run): the run's summary, labelled; a training set reads "(train)"."""
    return [dict(cell, model=res["model"], method=run,
                 set=f"{set_name} (train)" if set_name in res.get("train_sets", ()) else set_name)
            for res in results for set_name, per_run in res["speed"].items() for run, cell in per_run.items()]


def sampling_text(args: dict) -> str:
    """How the speed runs chose their tokens, from the run's settings."""
    if not args.get("temperature"):
        return "greedy"
    return (f"sampled (temperature {args['temperature']}, top-k {args.get('top_k', 0)}, top-p "
            f"{args.get('top_p', 1.0)}, seed {args.get('seed', 0)})")


def processes_text(args: dict) -> str:
    """What a multi-process run's timings mean (``eval.parts``), from the run's settings; "" for one process."""
    count = args.get("processes", 1)
    if count == 1:
        return ""
    return (f" Decoded by {count} processes side by side, each its share of every set, one prompt at a time: tok/s "
            "and x AR sum per-prompt times measured while the processes shared the machines, so they are not "
            "comparable with a one-process run's; TPF, tokens, loops, = AR and the quality scores are the "
            "one-process run's.")


def markdown(results: list[dict], args: dict) -> str:
    """OUT.md: the speed table of every model, then the GSM8K and HumanEval tables of the models scored on them;
    ``args`` are the run's settings (the command's options, with the device and the process count)."""
    from jf_jax.decoding.stats import BOOTSTRAP_RESAMPLES
    from jf_jax.eval.answer_quality import LOOP_REPEAT_FRACTION, REPEAT_NGRAM
    from jf_jax.eval.stats_table import render_table

    trained = any(r.get("train_sets") for r in results)
    lines = [f"# Evaluation ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"max_new_tokens {args['max_new_tokens']}, {sampling_text(args)}, batch 1, "
             f"{args.get('dtype', 'float32')}, {args.get('device', 'CPU (2 cores)')}. "
             "TPF = tokens / forwards (prefill counted), over the set's totals; TPF (mean/prompt) with its "
             f"bootstrap 95% interval ({BOOTSTRAP_RESAMPLES} resamples, seed 0). An answer loops when it ran to "
             f"max_new_tokens and at least {LOOP_REPEAT_FRACTION:.0%} of its {REPEAT_NGRAM}-grams repeat an "
             "earlier one (docs/method.md, section 8); loop rate = looping answers / prompts, and the 'without "
             "loops' columns summarize the other answers. tok/s with / without prefill; x AR = tok/s over "
             "same-dtype AR's on the same prompts, with / without prefill; = AR: share of answers equal to AR's."
             + (" Sets marked (train) hold prompts the model was trained on; the others are held out."
                if trained else "") + processes_text(args), "",
             render_table(speed_rows(results), SPEED_COLUMNS)]
    if any(r["math"] for r in results):
        lines += ["", f"Quality: greedy AR answers in {args.get('quality_dtype', 'float32')}.", "",
                  "| model | GSM held-out problems | correct | accuracy |", "|---|---|---|---|"]
        for res in results:
            if res["math"]:
                m = res["math"]
                lines.append(f"| {res['model']} | {m['problems']} | {m['correct']} | {m['accuracy']:.3f} |")
    if any(r["humaneval"] or r.get("humaneval_nll") for r in results):
        lines += ["", f"HumanEval, in {args.get('quality_dtype', 'float32')}: greedy AR answers, each executed "
                  "against the problem's tests in a sandboxed subprocess (`jf_jax/eval/code_execution.py`); NLL: "
                  "nats per token of the canonical solutions, teacher-forced (`humaneval_answer_nll`).", "",
                  "| model | problems executed | max new tokens | passed | pass@1 | problems scored | solution NLL |",
                  "|---|---|---|---|---|---|---|"]
        for res in results:
            h, nll = res["humaneval"], res.get("humaneval_nll")
            if not (h or nll):
                continue
            passed = (f"{h['problems']} | {h['max_new_tokens']} | {h['passed']} | {h['pass_at_1']:.3f}" if h
                      else "- | - | - | -")
            scored = f"{nll['problems']} | {nll['nll_per_token']:.3f}" if nll else "- | -"
            lines.append(f"| {res['model']} | {passed} | {scored} |")
    return "\n".join(lines) + "\n"


def write_atomically(path: str, text: str) -> None:
    """``path`` holds ``text``, or, if the write fails, what it held before: the text goes to a temporary file in
    the same directory (same file system), which then replaces ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would create it: mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_report(out: str, run: dict, results: list[dict], *, tables: bool = True) -> None:
    """OUT.json (``run``'s settings, its model list being the results', and ``results``) and, with ``tables``,
    OUT.md (``markdown(results, run)``), each replaced whole; a multi-process run's part is OUT.json alone."""
    run = dict(run, model=[r["model"] for r in results])
    write_atomically(out + ".json", json.dumps(dict(args=run, results=results), indent=1))
    if tables:
        write_atomically(out + ".md", markdown(results, run))


def read_report(path: str) -> tuple[dict, list[dict]]:
    """The settings and the results of the report OUT.json at ``path``. An unreadable file raises OSError; one
    that is not such a report raises ValueError (not JSON, or a result without its model), KeyError (no args or
    results) or TypeError (JSON of another shape)."""
    with open(path) as f:
        report = json.load(f)
    settings, results = report["args"], report["results"]
    if not isinstance(settings, dict) or not all(isinstance(r, dict) and "model" in r for r in results):
        raise ValueError("no args, or a result without its model")
    return settings, results
