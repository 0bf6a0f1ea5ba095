"""The development lane's list of measured slow tests (``tests/support/slow_tests.py``)."""

from tests.support.slow_tests import measured_slow, slow_test_ids

LOG = """============================= slowest durations ==============================
3.10s call     tests/test_a.py::test_slow[bfloat16-shards]
1.50s setup    tests/test_a.py::test_split
0.60s call     tests/test_a.py::test_split
0.40s call     tests/test_b.py::test_fast
658 passed, 47 skipped in 1535.76s (0:25:35)
"""


def test_a_test_is_slow_when_its_setup_call_and_teardown_add_up_to_the_threshold():
    assert measured_slow(LOG, seconds=2.0) == ["tests/test_a.py::test_slow[bfloat16-shards]",
                                               "tests/test_a.py::test_split"]


def test_the_committed_list_names_tests_in_this_repository(pytestconfig):
    ids = slow_test_ids()
    assert ids and all(node.startswith("tests/test_") and "::" in node for node in ids)
    files = {node.split("::")[0] for node in ids}
    assert all((pytestconfig.rootpath / f).exists() for f in files), sorted(files)
