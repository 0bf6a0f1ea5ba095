"""The tree's habits, enforced by the suite: ruff passes, and imports run one way along the data flow."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Layers of the package, lowest first: a module may import its own package and any lower layer, never a higher
# one (cli -> api -> decoding / training / tuning -> model / weights / data -> pallas_kernels / cpu_kernels).
# Layers on one rank are independent of each other.
RANKS = {
    "pallas_kernels": 0, "cpu_kernels": 0,
    "jf_jax.model": 1,
    "jf_jax.weights": 2, "jf_jax.data": 2,
    "jf_jax.decoding": 3, "jf_jax.training": 3,
    "jf_jax.tuning": 4,
    "jf_jax.api": 5, "jf_jax.flax": 5, "jf_jax": 5,  # the package's __init__ re-exports the api
    "jf_jax.cli": 6, "jf_jax.serving": 6,  # the server engine: beside the cli, over the api and the decoders
    # the entry modules: python -m jf_jax[.COMMAND]
    "jf_jax.__main__": 7, "jf_jax.decode": 7, "jf_jax.prompts": 7, "jf_jax.collect": 7, "jf_jax.train": 7,
    "jf_jax.evaluate": 7, "jf_jax.doctor": 7, "jf_jax.export": 7, "jf_jax.tune": 7, "jf_jax.results": 7,
    "jf_jax.plan": 7,
    "jf_jax.serve": 7,
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
