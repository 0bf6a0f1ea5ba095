"""Where a test run's time goes: a pytest plugin that sums JAX's compile events per test, and a summary of its log.

    CI=true JF_COMPILE_PROFILE=prof.jsonl python -m pytest -q -p tests.support.compile_profile
    python tests/support/compile_profile.py prof.jsonl

Each test appends one JSON line (both xdist workers to the same file): its wall seconds (setup, call and teardown),
XLA backend compile seconds and count, tracing and lowering seconds, and the seconds the persistent compilation
cache saved. Tests that run subprocesses (notebooks, CLI entry points, multi-process runs) compile there, unseen:
their wall time is all that is counted.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import pytest

PATH_ENV = "JF_COMPILE_PROFILE"
_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile_s",
           "/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "trace_s",
           "/jax/compilation_cache/compile_time_saved_sec": "cache_saved_s"}
_current = {"sums": None}


def _listener(event, seconds, **_):
    sums = _current["sums"]
    if sums is not None and event in _EVENTS:
        sums[_EVENTS[event]] += seconds
        sums["compiles"] += event.endswith("backend_compile_duration")


def pytest_configure(config):
    import jax

    jax.monitoring.register_event_duration_secs_listener(_listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    sums = _current["sums"] = collections.Counter()
    start = time.perf_counter()
    yield
    _current["sums"] = None
    row = {"test": item.nodeid, "wall_s": time.perf_counter() - start, **sums}
    with open(os.environ.get(PATH_ENV, "compile_profile.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(rows: list[dict], top: int = 25) -> str:
    """Totals, then the ``top`` files by wall seconds with their compile seconds and counts."""
    total = collections.Counter()
    files = collections.defaultdict(collections.Counter)
    for row in rows:
        numbers = {k: v for k, v in row.items() if k != "test"}
        total.update(numbers)
        files[row["test"].split("::")[0]].update(numbers)
    lines = [f"{len(rows)} tests: {total['wall_s']:.0f} s, of it {total['compile_s']:.0f} s in {total['compiles']} "
             f"backend compiles and {total['trace_s']:.0f} s tracing and lowering; the cache saved "
             f"{total['cache_saved_s']:.0f} s"]
    for name, c in sorted(files.items(), key=lambda kv: -kv[1]["wall_s"])[:top]:
        lines.append(f"{c['wall_s']:8.1f} s  compile {c['compile_s']:7.1f} s  {c['compiles']:5d}  {name}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/support/compile_profile.py PROFILE.jsonl", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        print(summary([json.loads(line) for line in f if line.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
