"""The tree's habits, enforced by the suite: ruff passes, imports run one way along the data flow, nothing edits
``sys.path``, and experiments/ is a leaf: its scripts import only the packages, and neither the packages nor the
tests import or run anything in it."""

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Layers of the package, lowest first: a module may import its own package and any lower layer, never a higher
# one (cli -> eval -> api -> decoding / training / tuning -> model / weights / data -> pallas_kernels / cpu_kernels).
# Layers on one rank are independent of each other.
RANKS = {
    "pallas_kernels": 0, "cpu_kernels": 0,
    "jf_jax.model": 1, "jf_jax.multihost": 1,
    "jf_jax.weights": 2, "jf_jax.data": 2,
    "jf_jax.decoding": 3, "jf_jax.training": 3,
    "jf_jax.tuning": 4,
    "jf_jax.api": 5, "jf_jax.flax": 5, "jf_jax": 5,  # the package's __init__ re-exports the api
    "jf_jax.eval": 6,  # evaluation as library code: over the api, under the commands that report it
    "jf_jax.cli": 7,
    "jf_jax.serving": 7.5,  # the server: over the api and the decoders, and the cli's shared options (--mesh)
    "jf_jax.pipeline": 7,  # the study runner: runs the commands as subprocesses, reads their outputs
    # the entry modules: python -m jf_jax[.COMMAND]
    "jf_jax.__main__": 8, "jf_jax.decode": 8, "jf_jax.prompts": 8, "jf_jax.collect": 8, "jf_jax.train": 8,
    "jf_jax.evaluate": 8, "jf_jax.doctor": 8, "jf_jax.export": 8, "jf_jax.tune": 8, "jf_jax.results": 8,
    "jf_jax.plan": 8,
    "jf_jax.serve": 8, "jf_jax.study": 8,
    "jf_jax.benchmarks": 8,  # the benchmarks and studies: python -m jf_jax.benchmarks.NAME (experiments/ calls them)
}
PACKAGES = ("jf_jax", "pallas_kernels", "cpu_kernels")


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in (2, 1):
        if ".".join(parts[:n]) in RANKS:
            return ".".join(parts[:n])
    raise AssertionError(f"module {module} belongs to no layer of tests/test_lint.py::RANKS")


def project_modules():
    for path in [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def imported_modules(path: pathlib.Path, known: set[str]):
    """Every project module ``path`` imports, at top level or inside functions (``from pkg import submodule``
    counts as importing the submodule, not the package)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            names = subs if len(subs) == len(node.names) else [node.module, *subs]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                yield name


def test_ruff_check_passes():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", *PACKAGES, "tests", "experiments"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_imports_run_one_way():
    modules = dict(project_modules())
    wrong = []
    for module, path in modules.items():
        here = layer_of(module)
        for target in imported_modules(path, modules.keys()):
            there = layer_of(target)
            if there != here and RANKS[there] >= RANKS[here] and not (here == "jf_jax" and there == "jf_jax.api"):
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert not wrong, "imports against the data flow:\n" + "\n".join(wrong)


def test_module_import_graph_has_no_cycle():
    modules = dict(project_modules())
    graph = {m: {t if t in modules else t.rpartition(".")[0] for t in imported_modules(p, modules.keys())}
                & modules.keys() - {m}
             for m, p in modules.items()}
    # A package imports its submodules for re-export; that edge is not a dependency of the package's code.
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state, cycle = {}, []

    def visit(m, stack):
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycle.extend(stack[stack.index(t):] + [t])
                return True
            if t not in state and visit(t, stack + [t]):
                return True
        state[m] = "done"
        return False

    for m in sorted(graph):
        if m not in state and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)


def test_nothing_imports_the_experiments_folder():
    """experiments/ holds benchmarks and studies, run as scripts; the package and the tests never import them."""
    wrong = []
    for path in [*sorted((ROOT / "tests").rglob("*.py")), *(p for _, p in project_modules())]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] == "experiments"]
    assert not wrong, "\n".join(wrong)


EXPERIMENTS = ROOT / "experiments"
SYS_PATH_READS = {"index", "count", "copy"}
"""The methods of ``sys.path`` that leave it as it was; any other call on it changes where imports come from."""
SYS_PATH_IN_SHELL = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b|\+=|=(?!=)|\[)"
                               r"|site\.addsitedir")
NAMES_EXPERIMENTS = re.compile(r"(?<![\w.-])experiments(?:[/\\]|$)")
"""A path into experiments/ (``experiments/x.py``, ``ROOT / "experiments"``, ``join(root, "experiments", ...)``)."""
IMPORTERS = {"import_module", "__import__", "run_path", "run_module", "spec_from_file_location"}
LINT_ITSELF = pathlib.Path(__file__).resolve()
"""This file names experiments/ in code (it is the folder these rules check); no other file outside it may."""


def is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def sys_path_edits(source: str) -> list[int]:
    """Lines of Python ``source`` that change ``sys.path``: an assignment to it or into it, ``del`` of its items,
    a call of a method that changes it, ``site.addsitedir``, or ``from sys import path`` (an alias the rest
    would not follow). Reading it (``[*sys.path]``, ``sys.path.index``) is not an edit."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        if any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                (is_sys_path(node.func.value) and node.func.attr not in SYS_PATH_READS)
                or (node.func.attr == "addsitedir" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "site")):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def shell_sys_path_edits(text: str) -> list[int]:
    """Lines of a shell script whose embedded Python changes ``sys.path`` (comments aside)."""
    return [i for i, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#") and SYS_PATH_IN_SHELL.search(line)]


def sibling_imports(source: str, siblings: set[str]) -> list[str]:
    """What Python ``source`` imports from experiments/ (a module named like one of ``siblings``, the
    ``experiments`` package, a relative import, or such a name given to importlib / runpy / ``__import__``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in IMPORTERS:
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            names = [pathlib.PurePath(n).stem if n.endswith(".py") else n for n in names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.startswith(".") or n.split(".")[0] in siblings | {"experiments"}]
    return [f"line {line}: {name}" for line, name in sorted(found)]


def experiments_paths(source: str) -> list[str]:
    """The strings of Python ``source``'s code that name a path into experiments/. A string that is a statement
    of its own (a docstring, an attribute's documentation) is documentation and may; comments are not code."""
    tree = ast.parse(source)
    documentation = {id(node.value) for node in ast.walk(tree)
                     if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [f"line {node.lineno}: {node.value!r}" for node in sorted(ast.walk(tree), key=lambda n: (
            getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documentation
            and NAMES_EXPERIMENTS.search(node.value)]


def tree_files(*folders: str, suffix: str = ".py") -> list[pathlib.Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob(f"*{suffix}"))]


def test_nothing_edits_sys_path():
    """Imports come from the installed packages and the working directory, never from a path a file adds at run
    time (which hides a module that only imports from one folder, and breaks when that folder moves)."""
    wrong = [f"{path.relative_to(ROOT)}:{line}" for path in tree_files(*PACKAGES, "tests", "experiments")
             for line in sys_path_edits(path.read_text())]
    wrong += [f"{path.relative_to(ROOT)}:{line}" for path in tree_files(*PACKAGES, "tests", "experiments",
                                                                        suffix=".sh")
              for line in shell_sys_path_edits(path.read_text())]
    assert not wrong, "sys.path edited at:\n" + "\n".join(wrong)


def test_experiments_import_only_the_packages():
    """An experiments/ script is a caller of the packages; what two scripts share lives in a package
    (jf_jax.benchmarks), not in one script that the other imports."""
    scripts = sorted(EXPERIMENTS.glob("*.py"))
    siblings = {p.stem for p in scripts}
    wrong = [f"{path.relative_to(ROOT)} {found}" for path in scripts
             for found in sibling_imports(path.read_text(), siblings - {path.stem})]
    assert not wrong, "experiments/ files importing each other:\n" + "\n".join(wrong)


def test_nothing_outside_experiments_runs_a_file_in_it():
    """The tests and the packages run benchmarks as ``python -m jf_jax.benchmarks.NAME`` (or call them), never
    an experiments/ script by its path: a script there may change or go without a test or a module noticing."""
    paths = [*tree_files("tests"), *(p for _, p in project_modules())]
    wrong = [f"{path.relative_to(ROOT)} {found}" for path in paths if path.resolve() != LINT_ITSELF
             for found in experiments_paths(path.read_text())]
    assert not wrong, "paths into experiments/ in code:\n" + "\n".join(wrong)


def test_the_rules_catch_what_they_name():
    edits = "import sys, site\nsys.path.insert(0, 'x')\nsys.path += ['y']\nsys.path[:0] = ['z']\nsite.addsitedir('w')\n"
    assert sys_path_edits(edits) == [2, 3, 4, 5]
    assert sys_path_edits("import sys\npaths = [*sys.path]\nsys.path.index('x')\n") == []
    assert shell_sys_path_edits("python -c 'import sys; sys.path.insert(0, \".\")'\n# sys.path.append\n") == [1]
    imports = ("import bench_a\nfrom bench_a import f\nfrom . import g\nimportlib.import_module('bench_a')\n"
               "import jf_jax\n")
    assert [f.split(":")[0] for f in sibling_imports(imports, {"bench_a"})] == ["line 1", "line 2", "line 3", "line 4"]
    code = ('"""Run experiments/a.py."""\nsubprocess.run(["python", "experiments/a.py"])\n'
            'open(os.path.join(ROOT, "experiments", "a.py"))\n# experiments/a.py\nX = 1\n"""experiments/a.py"""\n')
    assert [f.split(":")[0] for f in experiments_paths(code)] == ["line 2", "line 3"]
