"""What a study needs from the machine, checked before its first stage: the files it reads, the models it starts
from, the commands it calls, and every arm's training config loaded with the study's overrides (a wrong key is
refused now, not after an hour of collection)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from jf_jax.pipeline.plan import points
from jf_jax.pipeline.spec import Study, StudyError
from jf_jax.training.config import ConfigKeyError, TrainConfig, load_config


def check_inputs(study: Study, *, dry_run: bool = False) -> list[str]:
    """Raises ``StudyError`` for the first input that is missing. Inputs that other runs make (a pool the study
    does not build, a model another study trains) are only noted under ``dry_run``, which shows a plan before
    they exist; the notes are returned."""
    if study.train and not os.path.isfile(study.train.config):
        raise StudyError(f"train.config: {study.train.config} does not exist")
    missing = []
    if study.pool.build is None:  # the pool is there already: every file of it the stages name
        named = [os.path.join(study.pool.dir, s.prompts) for s in study.collect.sources] if study.collect else []
        named += [v for e in study.evaluations for _, value in e.options
                  for v in (value if isinstance(value, tuple) else (value,))
                  if isinstance(v, str) and v.startswith(os.path.join(study.pool.dir, ""))]
        missing += [f"pool file {path} (pool.dir holds no such file and pool.build is not set)"
                    for path in dict.fromkeys(named) if not os.path.isfile(path)]
    trained_here = {os.path.normpath(p.run_dir) for p in points(study)}
    models = [study.model] + ([study.collect.model] if study.collect else [])
    models += [m for e in study.evaluations for m in e.models if m != "base" and m not in {a.name for a in study.arms}]
    for model in dict.fromkeys(models):
        if _names_a_path(model) and not os.path.exists(model) and os.path.normpath(model) not in trained_here:
            missing.append(f"model {model} (a path that does not exist; if another study trains it, run that first)")
    commands = None
    for i, words in enumerate(c.words for c in study.commands):
        if words[0].endswith(".py"):
            if not os.path.isfile(words[0]):
                raise StudyError(f"commands[{i}]: script {words[0]} does not exist")
        elif "." in words[0]:
            if not _module_exists(words[0]):
                raise StudyError(f"commands[{i}]: module {words[0]} does not exist")
        else:
            commands = commands or jf_jax_commands()
            if words[0] not in commands:
                raise StudyError(f"commands[{i}]: {words[0]!r} is not a jf-jax command ({', '.join(commands)}), a "
                                 "module or a .py script")
    if missing and not dry_run:
        raise StudyError(f"missing {missing[0]}")
    return [f"not there yet: {m}" for m in missing]


def arm_configs(study: Study) -> dict[str, TrainConfig]:
    """Every arm's training config as its runs load it (the study's and the arm's overrides applied; ``data.path``,
    which the study sets to the collected parts, stands in)."""
    configs = {}
    block_size = dict(study.collect.options).get("block-size") if study.collect else None
    for arm in study.arms:
        try:
            cfg = load_config(study.train.config, ["data.path=[collected]", *study.train.overrides, *arm.overrides])
        except (ConfigKeyError, ValueError, TypeError) as e:
            raise StudyError(f"arms.{arm.name}: {' '.join(str(e).split())}") from None
        if block_size is not None and int(block_size) != cfg.data.block_size:
            raise StudyError(f"arms.{arm.name}: trains at data.block_size={cfg.data.block_size} on trajectories "
                             f"collected at collect.options.block-size={block_size}")
        configs[arm.name] = cfg
    return configs


def jf_jax_commands() -> list[str]:
    """The commands ``jf-jax`` has, as its own usage lists them (asked in a subprocess, like every stage)."""
    proc = subprocess.run([sys.executable, "-m", "jf_jax", "--help"], capture_output=True, text=True)
    lines = proc.stdout.split("commands:\n", 1)[-1].splitlines()
    names = [line.split()[0] for line in lines if line.startswith("  ") and line.split()]
    if proc.returncode or not names:
        raise StudyError(f"`{sys.executable} -m jf_jax --help` did not list the commands (exit {proc.returncode})")
    return names


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that does not exist
        return False


def _names_a_path(model: str) -> bool:
    """A spec with a directory part or a .gguf suffix names a file; other specs are model names (smollm2-135m)."""
    return os.sep in model or "/" in model or model.endswith(".gguf")
