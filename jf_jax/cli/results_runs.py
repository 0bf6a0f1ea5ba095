"""What ``jf-jax results`` reads from one ``results/<run>/`` folder: a ``RunSummary`` of its config, held-out
speed, quality and export check, taken from the files the pipeline writes there (``jf_jax.cli.evaluate``'s JSON,
``experiments/check_export.py``'s JSON, the run directory's ``config.yaml``) and its ``NOTES.md``.

Every number comes from those files; nothing here is typed in. Files written before a field existed (the first
evaluations have no speedup and name methods without a block size) are read as far as they go, and files written
before evaluate took ``decoding.stats``' key names (``speedup``, ``tokens_per_s``) are read under those.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml

SPEED_FILES = ("speed.json", "eval.json")
"""Where a run's held-out speed is, in order: the first rounds wrote speed and GSM8K into one ``eval.json``."""
QUALITY_FILES = ("quality.json", "eval.json", "gsm8k.json")
"""Where its HumanEval and GSM8K results are, in order (the first file holding one for the run's model wins)."""
PREFERRED_BLOCK_SIZE = 16
"""The block size the index shows when it was measured: the paper's n, measured by every n = 16 round (runs that
were only measured at other block sizes show their largest)."""
SPEED_DOMAIN = "code_heldout"
"""The held-out prompt set whose TPF the index shows (the training domain; the math set is in each speed.md)."""
ROUND_SUFFIX = re.compile(r"_r\d+[a-z]*$")
"""A run name's round suffix (_r2, _r4b ...): the name without it is the run's recipe (``recipe_of``)."""


@dataclasses.dataclass(frozen=True)
class MethodSpeed:
    tpf: float
    x_ar: float | None  # tokens/s over AR's in the same process, prefill counted; None when not recorded
    match_ar: float | None  # fraction of prompts whose tokens equal AR's
    prompts: int | None = None
    looping: int | None = None  # answers that loop (eval.answer_quality's rule); None when not recorded
    tpf_without_loops: float | None = None  # TPF over the answers that do not loop (None: unknown or all loop)

    @property
    def lossless(self) -> bool:
        return self.match_ar == 1.0


def loop_split(cell: dict, max_new_tokens: int | None) -> tuple[int | None, int | None, float | None]:
    """(answers, looping answers, TPF without them) of one speed cell. The current evaluate records each answer's
    ``loops``; the first files kept only the answers and their TPF, so the rule is applied here, with an answer
    that filled ``max_new_tokens`` counted as stopped by the cap (those files did not record stop reasons)."""
    from jf_jax.eval.answer_quality import TOKEN_CAP_STOP, loops

    if cell.get("per_prompt") and all("loops" in p for p in cell["per_prompt"]):
        records = [(p["tokens"], p["forwards"], bool(p["loops"])) for p in cell["per_prompt"]]
    elif cell.get("token_ids") and cell.get("per_prompt_tpf") and max_new_tokens:
        records = [(len(ids), len(ids) / tpf, loops(ids, TOKEN_CAP_STOP if len(ids) >= max_new_tokens else "eos"))
                   for ids, tpf in zip(cell["token_ids"], cell["per_prompt_tpf"])]
    else:
        return cell.get("prompts"), None, None
    kept = [(t, f) for t, f, looped in records if not looped]
    without = sum(t for t, _ in kept) / sum(f for _, f in kept) if kept else None
    return len(records), len(records) - len(kept), without


@dataclasses.dataclass(frozen=True)
class Speed:
    source: str  # file name inside the run folder
    device: str | None
    dtype: str | None
    block_size: int
    methods: dict[str, MethodSpeed]  # "jacobi" / "mr" -> at ``block_size`` on SPEED_DOMAIN


@dataclasses.dataclass(frozen=True)
class RunSummary:
    name: str
    what: str | None  # NOTES.md's first line below its heading
    config: dict | None  # config.yaml (the resolved TrainConfig)
    speed: Speed | None
    humaneval: dict | None  # evaluate's "humaneval" entry (passed, problems, pass_at_1, ...)
    gsm8k: dict | None  # evaluate's "math" entry (correct, problems, accuracy)
    export_diff: float | None  # export_check.json: max |logit difference| against jf-jax

    @property
    def recipe(self) -> str:
        return recipe_of(self.name)

    def config_value(self, section: str, key: str):
        return ((self.config or {}).get(section) or {}).get(key)

    def started_from(self) -> str | None:
        """The base model spec, or ``runs/NAME`` of the run it continues (model.source: run)."""
        return self.config_value("model", "path")


def recipe_of(name: str) -> str:
    return ROUND_SUFFIX.sub("", name)


def first_line_of_notes(folder: Path) -> str | None:
    """The first non-blank line below NOTES.md's ``# heading`` (what the run is, in one line)."""
    path = folder / "NOTES.md"
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    body = lines[1:] if lines and lines[0].startswith("# ") else lines
    return next((line.strip() for line in body if line.strip()), None)


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def run_result(report: dict, names: set[str]) -> dict | None:
    """The run's own model in an evaluation report: the result named after the run (its folder or its config's
    run_name); else the last one, as evaluations list the base model and earlier rounds first."""
    results = report.get("results") or []
    named = [r for r in results if r.get("name") in names]
    return named[-1] if named else (results[-1] if results else None)


def _block_size(key: str, cell: dict, args: dict) -> int | None:
    """A speed cell's block size: its own field, else the "n=16" of its key, else the report's only --block-size."""
    if cell.get("block_size"):
        return int(cell["block_size"])
    match = re.search(r"n=(\d+)", key)
    if match:
        return int(match.group(1))
    sizes = args.get("block_size")
    sizes = sizes if isinstance(sizes, list) else [sizes]
    return int(sizes[0]) if len(sizes) == 1 and sizes[0] else None


def _either(cell: dict, key: str, old_key: str):
    """``cell[key]`` under ``decoding.stats``' schema, else under the name evaluate wrote before it (``old_key``),
    else None: committed results are read as written, never rewritten."""
    return cell[key] if cell.get(key) is not None else cell.get(old_key)


def speed_of(report: dict, result: dict, source: str) -> Speed | None:
    args = report.get("args") or {}
    cells = (result.get("speed") or {}).get(SPEED_DOMAIN) or {}
    ar = cells.get("ar") or {}
    by_size: dict[int, dict[str, MethodSpeed]] = {}
    for key, cell in cells.items():
        method = key.split()[0]
        size = _block_size(key, cell, args)
        if method == "ar" or size is None:
            continue
        x_ar = _either(cell, "speedup_vs_ar", "speedup")
        rate, ar_rate = (_either(c, "tokens_per_second", "tokens_per_s") for c in (cell, ar))
        if x_ar is None and rate and ar_rate:
            x_ar = rate / ar_rate  # what evaluate now records as speedup_vs_ar
        prompts, looping, without = loop_split(cell, args.get("max_new_tokens"))
        by_size.setdefault(size, {})[method] = MethodSpeed(cell["tpf"], x_ar, cell.get("match_ar"), prompts, looping,
                                                           without)
    if not by_size:
        return None
    size = PREFERRED_BLOCK_SIZE if PREFERRED_BLOCK_SIZE in by_size else max(by_size)
    return Speed(source=source, device=args.get("device"), dtype=result.get("dtype") or args.get("dtype"),
                 block_size=size, methods=by_size[size])


def read_run(folder: Path) -> RunSummary:
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else None
    names = {folder.name} | ({config["run_name"]} if config and config.get("run_name") else set())
    speed = None
    for name in SPEED_FILES:
        report = _read_json(folder / name)
        result = run_result(report, names) if report else None
        speed = speed_of(report, result, name) if result else None
        if speed:
            break
    quality = {"humaneval": None, "math": None}
    for name in QUALITY_FILES:
        report = _read_json(folder / name)
        result = run_result(report, names) if report else None
        for key in quality:
            if quality[key] is None and result and result.get(key):
                quality[key] = {k: v for k, v in result[key].items() if k != "items"}
    export = _read_json(folder / "export_check.json")
    return RunSummary(name=folder.name, what=first_line_of_notes(folder), config=config, speed=speed,
                      humaneval=quality["humaneval"], gsm8k=quality["math"],
                      export_diff=export.get("max_abs_logit_diff") if export else None)


def run_folders(results_dir: Path) -> list[Path]:
    """Every run folder: the directories of ``results/`` but ``studies/``, sorted by name."""
    return sorted(p for p in results_dir.iterdir() if p.is_dir() and p.name != "studies")


def study_heading(folder: Path) -> str | None:
    """A study folder's title: the first heading of its README.md, else of its first markdown file that has one."""
    candidates = [folder / "README.md"] + sorted(p for p in folder.glob("*.md") if p.name != "README.md")
    for path in candidates:
        if path.is_file():
            heading = next((line[2:].strip() for line in path.read_text().splitlines() if line.startswith("# ")),
                           None)
            if heading:
                return heading
    return None


def headline_runs(runs: list[RunSummary]) -> list[RunSummary]:
    """README's headline: every run measured at the preferred block size, sorted by name (no round is picked for
    its numbers: a best-of-rounds on a few prompts flatters a recipe)."""
    return [r for r in runs if r.speed and r.speed.block_size == PREFERRED_BLOCK_SIZE]
