"""Which tests the development lane (``pytest -m "not slow"``) leaves out besides those marked ``slow`` in their
files: the ones that took ``SLOW_SECONDS`` or more (setup, call and teardown together) in a measured full run,
listed in ``tests/slow_tests.txt``. ``tests/conftest.py`` marks them.

    CI=true python -m pytest -q --durations=0 > LOG; python tests/support/slow_tests.py LOG

rewrites the list from such a run (the durations of every test; pytest hides those under 5 ms, which are fast).
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys

SLOW_SECONDS = 2.0
LIST = pathlib.Path(__file__).resolve().parent.parent / "slow_tests.txt"
_DURATION = re.compile(r"([0-9.]+)s (?:call|setup|teardown)\s+(tests/\S+::\S+)")


def slow_test_ids(path: pathlib.Path = LIST) -> frozenset[str]:
    """The node ids of ``tests/slow_tests.txt`` (lines after '#' are comments)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return frozenset(line for line in lines if line)


def measured_slow(log_text: str, seconds: float = SLOW_SECONDS) -> list[str]:
    """The node ids whose setup, call and teardown in ``log_text`` (pytest ``--durations=0``) add up to
    ``seconds`` or more."""
    total = collections.defaultdict(float)
    for took, node in _DURATION.findall(log_text):
        total[node] += float(took)
    return sorted(node for node, took in total.items() if took >= seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/support/slow_tests.py PYTEST_DURATIONS_LOG", file=sys.stderr)
        return 2
    ids = measured_slow(pathlib.Path(argv[0]).read_text())
    header = (f"# Tests that took {SLOW_SECONDS:g} s or more in a full run (tests/support/slow_tests.py); "
              "tests/conftest.py marks them slow.\n")
    LIST.write_text(header + "".join(f"{node}\n" for node in ids))
    print(f"{len(ids)} slow tests written to {LIST}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
