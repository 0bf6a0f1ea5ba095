"""A study file (``configs/studies/*.yaml``) read into frozen dataclasses and checked whole before anything runs.

A study file is YAML; ``base: OTHER.yaml`` merges it over another study (mappings key by key), as the training
configs do, and ``--set key=value`` changes one key (dotted, the value parsed as YAML) before the checks. An arm
or an evaluation set to null is left out, so a derived study or a ``--set`` can drop one. Strings in options,
environments, training overrides and commands may name ``{name}``, ``{pool}``, ``{run_dir}``, ``{results}``,
``{model}`` and ``{runs[ARM]}`` (the run directory of an arm trained once). Every fault raises ``StudyError`` with
one line that names the key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Mapping

from jf_jax.training.config import ConfigKeyError, apply_overrides, read_config_file

Options = tuple[tuple[str, Any], ...]
"""Command-line options in file order: ``(name, value)``, the value a scalar or a tuple of scalars (repeated)."""
Env = tuple[tuple[str, str], ...]

REPORTS = ("curve",)
OPTION_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


class StudyError(ValueError):
    """A study that cannot run as written; the message is one line naming the key and the problem."""


@dataclasses.dataclass(frozen=True)
class Pool:
    dir: str
    build: Options | None
    """``jf-jax prompts`` options that build the pool in ``dir`` when it holds none; None: ``dir`` holds it."""


@dataclasses.dataclass(frozen=True)
class Source:
    prompts: str  # a file of the pool
    limit: int  # prompts collected, from the file's first
    dir: str  # its parts: RUN_DIR/DIR/part-NNN, each the next part_size prompts


@dataclasses.dataclass(frozen=True)
class Collect:
    model: str
    sources: tuple[Source, ...]
    part_size: int
    workers: int  # collectors side by side, one part each at a time
    minutes: float | None  # a box: what is collected when it ends is the data (complete shards)
    env: Env
    options: Options


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]
    epochs: float | None  # passes over the responses kept (train.steps from them); None: the config's steps
    from_size: int  # trained only at sizes from this one
    run_dir: str | None  # None when the study trains at several sizes (one run directory per size)


@dataclasses.dataclass(frozen=True)
class Train:
    config: str
    overrides: tuple[str, ...]
    epochs: float | None  # every arm's, unless the arm has its own
    sizes: tuple[int, ...] | None  # a learning curve: each arm on the first SIZE prompts' parts
    parallel: int
    minutes: float | None  # a box per run: stop, export the weights reached, count it done
    env: Env


@dataclasses.dataclass(frozen=True)
class Evaluation:
    name: str
    models: tuple[str, ...]  # "base", arm names, or model specs
    each: bool  # one evaluation per model (NAME_<point>) rather than one of them all (NAME)
    parallel: int
    env: Env
    options: Options


@dataclasses.dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # a jf-jax command, a python module (dotted) or a .py script, and its arguments
    done_when_exists: str | None  # a file whose presence means it need not run (its output, kept in results/)


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    model: str
    run_dir: str
    results: str
    pool: Pool
    collect: Collect | None
    train: Train | None
    arms: tuple[Arm, ...]
    evaluations: tuple[Evaluation, ...]
    commands: tuple[Command, ...]
    report: str | None
    keep: tuple[str, ...]


def read_study(path: str, sets: tuple[str, ...] = ()) -> Study:
    """The study of ``path`` with ``sets`` (``key=value``) applied, checked against the schema."""
    if not os.path.isfile(path):
        raise StudyError(f"study file {path} does not exist")
    try:
        raw = apply_overrides(read_config_file(path), sets)
    except ConfigKeyError as e:
        raise StudyError(str(e).replace("override", "--set")) from None
    return parse_study(raw)


def parse_study(raw: Mapping) -> Study:
    where = "the study"
    _keys(raw, where, ("name", "model", "run_dir", "results", "pool", "collect", "train", "arms", "evaluate",
                       "commands", "report", "keep"), required=("name", "model", "run_dir", "pool"))
    name = _str(raw, "name", where)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise StudyError(f"{where}: name {name!r} may hold letters, digits, '_', '.' and '-' only")
    run_dir, model = _str(raw, "run_dir", where), _str(raw, "model", where)
    results = _str(raw, "results", where, os.path.join("results", "studies", name))
    pool_raw = _keys(raw["pool"], "pool", ("dir", "build"), required=("dir",))
    context = dict(name=name, pool=_str(pool_raw, "dir", "pool"), run_dir=run_dir, results=results,
                   model=model, runs={})
    train = None if raw.get("train") is None else _train(raw["train"], context, "train")
    arms = _arms(raw.get("arms"), train, run_dir, context, "arms")
    if arms and (train is None or raw.get("collect") is None):
        raise StudyError(f"{where}: arms need a train section and a collect section (the data they train on)")
    context["runs"] = {a.name: a.run_dir for a in arms if a.run_dir}
    if len(set(context["runs"].values())) < len(context["runs"]):
        raise StudyError(f"{where}: two arms share a run_dir; give each its own")
    build = None if pool_raw.get("build") is None else _options(pool_raw, "build", "pool", context, ("out",))
    pool = Pool(context["pool"], build)
    collect = None if raw.get("collect") is None else _collect(raw["collect"], model, train, context, "collect")
    evaluations = tuple(_evaluation(n, e, context, f"evaluate.{n}")
                        for n, e in _mapping(raw, "evaluate", where).items() if e is not None)
    listed = _list(raw, "commands", where)
    commands = tuple(_command(c, context, f"commands[{i}]") for i, c in enumerate(listed))
    report = raw.get("report")
    if report is not None and report not in REPORTS:
        raise StudyError(f"{where}: report must be one of {', '.join(REPORTS)} or null, got {report!r}")
    if report == "curve" and not (train and train.sizes and any(e.name == "eval" and e.each for e in evaluations)):
        raise StudyError(f"{where}: report: curve needs train.sizes and an evaluation named 'eval' with each: true "
                         "(it reads eval_<arm>_<size>.json)")
    keep = tuple(_words(raw, "keep", where))
    return Study(name=name, model=model, run_dir=run_dir, results=results, pool=pool, collect=collect, train=train,
                 arms=arms, evaluations=evaluations, commands=commands, report=report, keep=keep)


def _train(raw, context: dict, where: str) -> Train:
    _keys(raw, where, ("config", "overrides", "epochs", "sizes", "parallel", "minutes", "env"), required=("config",))
    sizes = raw.get("sizes")
    if sizes is not None:
        if (not isinstance(sizes, list) or not sizes
                or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)):
            raise StudyError(f"{where}: sizes must be a list of positive integers (prompts per point), got {sizes!r}")
        sizes = tuple(sizes)
    return Train(config=_str(raw, "config", where), overrides=tuple(_overrides(raw, where, context)),
                 epochs=_positive(raw, "epochs", where), sizes=sizes,
                 parallel=_int(raw, "parallel", where, 1), minutes=_positive(raw, "minutes", where),
                 env=_env(raw, where, context))


def _arms(raw, train: Train | None, run_dir: str, context: dict, where: str) -> tuple[Arm, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise StudyError(f"{where}: expected a mapping of arm name -> arm, got {_kind(raw)}")
    arms = []
    for name, arm in raw.items():
        if arm is None:
            continue
        here = f"{where}.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.]*", name) or name == "base":
            raise StudyError(f"{here}: an arm's name holds letters, digits, '_' and '.' and is not 'base'")
        _keys(arm, here, ("overrides", "epochs", "from_size", "run_dir"))
        epochs = _positive(arm, "epochs", here)
        explicit = _str(arm, "run_dir", here, None)
        curve = train is not None and train.sizes is not None
        if explicit and curve:
            raise StudyError(f"{here}: run_dir names one run, but train.sizes trains one per size")
        arms.append(Arm(name=name, overrides=tuple(_overrides(arm, here, context)),
                        epochs=epochs if epochs is not None else train.epochs if train else None,
                        from_size=_int(arm, "from_size", here, 0, minimum=0),
                        run_dir=None if curve else explicit or os.path.join(run_dir, name)))
    return tuple(arms)


def _collect(raw, model: str, train: Train | None, context: dict, where: str) -> Collect:
    _keys(raw, where, ("model", "sources", "part_size", "workers", "minutes", "env", "options"),
          required=("sources", "part_size"))
    sizes = train.sizes if train else None
    listed = raw["sources"]
    if not isinstance(listed, list) or not listed:
        raise StudyError(f"{where}: sources must be a list of {{prompts: FILE, limit: N}}, got {listed!r}")
    if sizes and len(listed) != 1:
        raise StudyError(f"{where}: train.sizes takes its points from one source, got {len(listed)}")
    sources = []
    for i, s in enumerate(listed):
        here = f"{where}.sources[{i}]"
        _keys(s, here, ("prompts", "limit", "dir"), required=("prompts",) if sizes else ("prompts", "limit"))
        prompts = _str(s, "prompts", here)
        limit = _int(s, "limit", here, max(sizes) if sizes else None)
        if sizes and max(sizes) > limit:
            raise StudyError(f"{here}: limit {limit} is below train.sizes' largest, {max(sizes)}")
        stem = os.path.splitext(os.path.basename(prompts))[0]
        sources.append(Source(prompts=prompts, limit=limit, dir=_str(s, "dir", here, f"trajectories/{stem}")))
    if len({s.dir for s in sources}) != len(sources):
        raise StudyError(f"{where}: two sources share a dir; give each its own")
    reserved = ("model", "prompts", "offset", "limit", "out", "no-progress")
    return Collect(model=_str(raw, "model", where, model), sources=tuple(sources),
                   part_size=_int(raw, "part_size", where), workers=_int(raw, "workers", where, 1),
                   minutes=_positive(raw, "minutes", where), env=_env(raw, where, context),
                   options=_options(raw, "options", where, context, reserved))


def _evaluation(name, raw, context: dict, where: str) -> Evaluation:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise StudyError(f"{where}: an evaluation's name holds letters, digits, '_', '.' and '-'")
    _keys(raw, where, ("models", "each", "parallel", "env", "options"), required=("models",))
    models = tuple(_words(raw, "models", where))
    if not models:
        raise StudyError(f"{where}: models is empty")
    each = raw.get("each", False)
    if not isinstance(each, bool):
        raise StudyError(f"{where}: each must be true or false, got {each!r}")
    return Evaluation(name=name, models=models, each=each, parallel=_int(raw, "parallel", where, 1),
                      env=_env(raw, where, context), options=_options(raw, "options", where, context, ("model", "out")))


def _command(raw, context: dict, where: str) -> Command:
    """A list of words, or ``{run: WORDS, done_when_exists: PATH}``."""
    done = None
    if isinstance(raw, Mapping):
        _keys(raw, where, ("run", "done_when_exists"), required=("run",))
        done = _str(raw, "done_when_exists", where, None)
        raw = raw["run"]
    if not isinstance(raw, list) or not raw or not all(isinstance(w, (str, int, float)) for w in raw):
        raise StudyError(f"{where}: a command is a list of words (a jf-jax command, module or .py script first), "
                         f"got {raw!r}")
    return Command(tuple(_format(str(w), context, where) for w in raw),
                   None if done is None else _format(done, context, where))


def _keys(raw, where: str, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> Mapping:
    if not isinstance(raw, Mapping):
        raise StudyError(f"{where}: expected a mapping, got {_kind(raw)}")
    for key in raw:
        if key not in keys:
            raise StudyError(f"{where}: unknown key {key!r} (known: {', '.join(keys)})")
    for key in required:
        if raw.get(key) is None:
            raise StudyError(f"{where}: {key} is missing")
    return raw


def _kind(value) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"


def _str(raw: Mapping, key: str, where: str, default: str | None = ...) -> str | None:
    value = raw.get(key)
    if value is None and default is not ...:
        return default
    if not isinstance(value, str) or not value:
        raise StudyError(f"{where}: {key} must be a non-empty string, got {_kind(value)}")
    return value


def _int(raw: Mapping, key: str, where: str, default: int | None = ..., minimum: int = 1) -> int:
    value = raw.get(key)
    if value is None and default is not ... and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise StudyError(f"{where}: {key} must be an integer of at least {minimum}, got {_kind(value)}")
    return value


def _positive(raw: Mapping, key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                  and math.isfinite(value) and value > 0):
        raise StudyError(f"{where}: {key} must be a positive number, got {_kind(value)}")
    return value


def _list(raw: Mapping, key: str, where: str) -> list:
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise StudyError(f"{where}: {key} must be a list, got {_kind(value)}")
    return value


def _mapping(raw: Mapping, key: str, where: str) -> Mapping:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StudyError(f"{where}: {key} must be a mapping, got {_kind(value)}")
    return value


def _words(raw: Mapping, key: str, where: str) -> list[str]:
    value = _list(raw, key, where)
    if not all(isinstance(w, str) and w for w in value):
        raise StudyError(f"{where}: {key} must be a list of strings, got {value!r}")
    return value


def _overrides(raw: Mapping, where: str, context: dict) -> list[str]:
    overrides = _words(raw, "overrides", where)
    for item in overrides:
        if "=" not in item:
            raise StudyError(f"{where}: override {item!r} is not of the form key=value")
    return [_format(item, context, f"{where}: overrides") for item in overrides]


def _format(text: str, context: dict, where: str) -> str:
    """``text`` with its ``{name}`` fields filled from ``context``; a field that names nothing is refused."""
    try:
        return text.format_map(context)
    except (KeyError, IndexError, AttributeError, ValueError) as e:
        runs = ", ".join(context["runs"]) or "none: no arm is trained once"
        raise StudyError(f"{where}: {text!r} names an unknown field ({e}); fields: {{name}}, {{pool}}, {{run_dir}}, "
                         f"{{results}}, {{model}}, {{runs[ARM]}} (arms: {runs})") from None


def _env(raw: Mapping, where: str, context: dict) -> Env:
    env = _mapping(raw, "env", where)
    for key, value in env.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or isinstance(
                value, (dict, list, bool)) or value is None:
            raise StudyError(f"{where}: env must map variable names to strings or numbers, got {key!r}: {value!r}")
    return tuple((k, _format(str(v), context, f"{where}: env.{k}")) for k, v in env.items())


def _options(raw: Mapping, key: str, where: str, context: dict, reserved: tuple[str, ...] = ()) -> Options:
    options = []
    for name, value in _mapping(raw, key, where).items():
        here = f"{where}: {key}.{name}"
        if not isinstance(name, str) or not OPTION_NAME.fullmatch(name):
            raise StudyError(f"{here}: an option's name is its long flag without '--' (e.g. block-size)")
        if name in reserved:
            raise StudyError(f"{here}: the study sets --{name} itself")
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (str, int, float, bool)) and not (isinstance(v, bool) and len(values) > 1)
                   for v in values):
            raise StudyError(f"{here}: expected a string, a number, true/false or a list of them, got {value!r}")
        values = [_format(v, context, here) if isinstance(v, str) else v for v in values]
        options.append((name, tuple(values) if isinstance(value, list) else values[0]))
    return tuple(options)
