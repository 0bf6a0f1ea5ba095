"""Code prompts from the documented public functions of the installed packages: the standard library and the
packages that requirements.txt / requirements-test.txt install (directly or as their dependencies).

Each source is read in a fresh interpreter of its own (``extract``), so what one package's import does (patching,
registering, printing) cannot reach another, and the result does not depend on which packages were imported
before or in what order. The child imports nothing of this project but this module and its two helpers (the
package ``__init__`` files are lazy), runs with a fixed hash seed, and writes JSON to a file (some packages print
to stdout on import).

In a child, the modules of a source are found from the installed files (``pkgutil.iter_modules``, nothing
imported while listing), skipping private, test and ``skip`` modules, and imported one by one in sorted order; a
module that fails to import is recorded and skipped. A module's public names are its ``__all__`` when it has one,
else its non-underscore globals, in sorted order. A name becomes a task when it is a function (pure Python,
a ``functools.wraps``-style wrapper of one, or a C builtin with a text signature), bears its own name (not an
alias), is defined by the source's own packages (not a re-export of another package's function), and its
docstring makes a description (``docstrings.describe``). A function reached under several modules is one task,
named after its defining module when that one is public, else after its shortest public path.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import keyword
import os
import pkgutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor

from jf_jax.data import docstrings
from jf_jax.data.code_prompts import stable_signature

_PRIVATE_PARTS = {"tests", "test", "testing", "conftest", "setup", "benchmarks", "benchmark", "__main__", "examples",
                  "test_utils", "testing_utils"}
# Standard-library modules never imported: side effects on import (antigravity opens a browser, this prints),
# GUI toolkits, and modules deprecated for removal (PEP 594, distutils, lib2to3, imp and the sre_* aliases).
STDLIB_SKIP = (
    "aifc", "antigravity", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "distutils",
    "encodings", "ensurepip", "idlelib", "imghdr", "imp", "lib2to3", "mailcap", "msilib", "nis", "nntplib",
    "ossaudiodev", "pipes", "pydoc_data", "smtpd", "sndhdr", "spwd", "sre_compile", "sre_constants", "sre_parse",
    "sunau", "telnetlib", "this", "tkinter", "turtle", "turtledemo", "uu", "xdrlib",
)


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    """The id prefix of its tasks and its key in the manifest."""
    distribution: str | None
    """The installed distribution (for its version and licence); None for the standard library."""
    packages: tuple[str, ...]
    """Top-level import packages (empty for the standard library: ``sys.stdlib_module_names``)."""
    skip: tuple[str, ...] = ()
    """Module names (and their submodules) never imported: optional dependencies, GUI backends, deprecated."""


SOURCES = (
    Source("stdlib", None, (), STDLIB_SKIP),
    Source("numpy", "numpy", ("numpy",), ("numpy.distutils", "numpy.f2py", "numpy.typing.mypy_plugin")),
    Source("scipy", "scipy", ("scipy",)),
    Source("jax", "jax", ("jax",), ("jax.experimental.jax2tf", "jax.collect_profile")),
    Source("flax", "flax", ("flax",)),
    Source("optax", "optax", ("optax",)),
    Source("orbax-checkpoint", "orbax-checkpoint", ("orbax.checkpoint",), ("orbax.checkpoint.experimental",)),
    Source("matplotlib", "matplotlib", ("matplotlib", "mpl_toolkits"), ("matplotlib.backends",)),
    Source("networkx", "networkx", ("networkx",)),
    Source("sympy", "sympy", ("sympy",), ("sympy.plotting.pygletplot", "sympy.galgebra", "sympy.this")),
    Source("mpmath", "mpmath", ("mpmath",), ("mpmath.tests",)),
    Source("jinja2", "jinja2", ("jinja2",)),
    Source("pyyaml", "pyyaml", ("yaml",)),
    Source("tqdm", "tqdm", ("tqdm",), ("tqdm.contrib", "tqdm.dask", "tqdm.keras", "tqdm.tk", "tqdm.gui", "tqdm.rich",
                                       "tqdm.notebook", "tqdm.autonotebook")),
)
SOURCE_NAMES = tuple(s.name for s in SOURCES)

# The child's environment: no accelerator probing, no GUI backend, no network, quiet.
CHILD_ENV = {"PYTHONHASHSEED": "0", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "MPLBACKEND": "Agg",
             "TF_CPP_MIN_LOG_LEVEL": "3", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
             "PYTHONWARNINGS": "ignore"}


def source(name: str) -> Source:
    for s in SOURCES:
        if s.name == name:
            return s
    raise ValueError(f"unknown code source {name!r}; known: {', '.join(SOURCE_NAMES)}")


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    parts = name.split(".")
    if any(p.startswith("_") or p in _PRIVATE_PARTS for p in parts):
        return True
    return any(name == s or name.startswith(s + ".") for s in skip)


def _walk(package: str, paths, skip) -> list[str]:
    out = []
    for info in pkgutil.iter_modules(list(paths), package + "."):
        if _skipped(info.name, skip):
            continue
        out.append(info.name)
        if info.ispkg:
            out += _walk(info.name, [os.path.join(info.module_finder.path, info.name.rpartition(".")[2])], skip)
    return out


def module_names(src: Source) -> list[str]:
    """Every module of ``src`` to import, sorted; found from the installed files without importing them."""
    tops = src.packages or tuple(sorted(sys.stdlib_module_names))
    names = []
    for top in tops:
        if _skipped(top, src.skip):
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        names.append(top)
        if spec.submodule_search_locations:
            names += _walk(top, spec.submodule_search_locations, src.skip)
    return sorted(set(names))


def _function(obj):
    """The function ``obj`` stands for (itself or what it wraps), or None when it is not function-like."""
    if isinstance(obj, type) or inspect.ismodule(obj):
        return None
    if inspect.isfunction(obj):
        return obj
    if inspect.isbuiltin(obj):
        return obj if getattr(obj, "__text_signature__", None) else None
    try:
        target = inspect.unwrap(obj) if hasattr(obj, "__wrapped__") else None
    except (ValueError, TypeError):
        return None
    return target if inspect.isfunction(target) else None


def _owned(obj, module: str, src: Source) -> bool:
    owner = getattr(obj, "__module__", None) or module
    if not isinstance(owner, str):
        return False
    if not src.packages:
        return owner.split(".")[0] in sys.stdlib_module_names
    return any(owner == p or owner.startswith(p + ".") for p in src.packages)


def _parses(sig: str) -> bool:
    try:
        ast.parse(f"def f{sig}:\n    pass\n")
    except SyntaxError:
        return False
    return True


def _signature(obj, max_chars: int) -> str | None:
    """The stable signature text, without annotations when they make it long or do not read back as Python
    (``-> <class 'BinaryIO'>``, a repr with an address); None when even that fails."""
    try:
        sig = stable_signature(obj)
        if len(sig) > max_chars // 2 or not _parses(sig):
            sig = stable_signature(obj, annotations=False)
    except (TypeError, ValueError, RuntimeError):
        return None
    return sig if len(sig) <= max_chars and _parses(sig) else None


def extract(src: Source, *, max_doc_chars: int = 900, max_signature_chars: int = 240) -> dict:
    """The tasks of ``src`` as dicts (source, module, name, qualified, signature, doc, builtin: written in C), in
    (module, name) order,
    with the modules imported and the ones that failed. Run it in a fresh interpreter (``extract_sources``)."""
    found, failed, imported = {}, [], 0  # qualified name -> [function, obj, name, modules it is found in]
    for mod_name in module_names(src):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except BaseException as e:  # noqa: BLE001 - an optional dependency missing, a platform-only module
            failed.append(f"{mod_name}: {type(e).__name__}")
            continue
        imported += 1
        for name, func, obj in _public_functions(mod, mod_name, src):
            qualified = f"{getattr(func, '__module__', None) or mod_name}.{getattr(func, '__qualname__', name)}"
            entry = found.setdefault(qualified, [func, obj, name, []])
            if entry[0] is func:
                entry[3].append(mod_name)
    tasks = []
    for qualified, (func, obj, name, modules) in found.items():
        doc = docstrings.describe(getattr(obj, "__doc__", None), max_chars=max_doc_chars)
        sig = _signature(obj, max_signature_chars) if doc else None
        if sig is None:
            continue
        # named after its defining module when that is public, else its shortest public path (numpy.median,
        # not numpy.lib.median)
        own = getattr(func, "__module__", None)
        module = own if own in modules else min(modules, key=lambda m: (m.count("."), m))
        tasks.append(dict(source=src.name, module=module, name=name, qualified=qualified, signature=sig, doc=doc,
                          builtin=not inspect.isfunction(func)))
    tasks.sort(key=lambda t: (t["module"], t["name"], t["qualified"]))
    return dict(source=src.name, modules=imported, failed=failed, tasks=tasks)


def _public_functions(mod, mod_name: str, src: Source):
    """(name, function, object) for each public function-like name of ``mod`` that ``src`` defines."""
    public = getattr(mod, "__all__", None)
    names = public if isinstance(public, (list, tuple)) else [n for n in vars(mod) if not n.startswith("_")]
    for name in sorted({n for n in names if isinstance(n, str)}):
        if name.startswith("_") or not name.isidentifier() or keyword.iskeyword(name):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obj = getattr(mod, name)
                func = _function(obj)
        except BaseException:  # noqa: BLE001 - lazy attributes that fail to load, lookups that probe CUDA
            continue
        if func is not None and getattr(obj, "__name__", None) == name and _owned(func, mod_name, src):
            yield name, func, obj


def distribution(src: Source) -> dict:
    """Version and licence of the source's distribution ({} when it is not installed)."""
    if src.distribution is None:
        return dict(version=sys.version.split()[0], licence="PSF-2.0")
    from importlib import metadata

    try:
        meta = metadata.metadata(src.distribution)
    except metadata.PackageNotFoundError:
        return {}
    # the SPDX expression, else a one-line License field, else the trove classifiers
    text = (meta.get("License") or "").strip()
    classifiers = [c.rsplit(" :: ", 1)[1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    licence = (meta.get("License-Expression") or (text if text and "\n" not in text and len(text) < 60 else "")
               or "; ".join(classifiers) or "see the package's metadata")
    return dict(version=meta["Version"], licence=licence)


_CHILD = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("jf_jax", sys.argv[1], submodule_search_locations=[sys.argv[2]])
package = importlib.util.module_from_spec(spec)
sys.modules["jf_jax"] = package
spec.loader.exec_module(package)
from jf_jax.data.library_tasks import _child_main
_child_main(sys.argv[3], sys.argv[4])
"""


def _child_main(name: str, out: str) -> None:
    result = extract(source(name))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)


def _run_child(src: Source, directory: str, timeout: float) -> dict:
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(directory, f"{src.name}.json")
    env = dict(os.environ) | CHILD_ENV
    # -P -s: neither the working directory nor the user's site-packages on sys.path (the parent's PYTHONPATH
    # stays, so the child sees the packages the parent found installed); cwd: where import-time side files land
    proc = subprocess.run([sys.executable, "-P", "-s", "-c", _CHILD, os.path.join(package_dir, "__init__.py"),
                           package_dir, src.name, out], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"reading the functions of {src.name} failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def extract_sources(names=SOURCE_NAMES, *, jobs: int = 2, timeout: float = 600.0) -> dict[str, dict]:
    """``extract`` for each named source in a child process (``jobs`` at a time), plus ``distribution`` info:
    {name: {"version", "licence", "modules", "failed", "tasks"}}. A source whose distribution is not installed
    maps to {"missing": True, "tasks": []}."""
    sources = [source(n) for n in names]
    out = {}
    with tempfile.TemporaryDirectory(prefix="jf_code_sources_") as tmp:
        todo = []
        for src in sources:
            info = distribution(src)
            if not info:
                out[src.name] = dict(missing=True, tasks=[])
            else:
                out[src.name] = info
                todo.append(src)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for src, result in zip(todo, pool.map(lambda s: _run_child(s, tmp, timeout), todo)):
                out[src.name] |= {k: v for k, v in result.items() if k != "source"}
    return {n: out[n] for n in names}
