"""The suite's compile profile (``tests/support/compile_profile.py``): events summed per test, and the summary."""

import collections

from tests.support import compile_profile


def test_events_are_summed_for_the_running_test_only():
    compile_profile._listener("/jax/core/compile/backend_compile_duration", 9.0)  # no test running: dropped
    sums = compile_profile._current["sums"] = collections.Counter()
    try:
        compile_profile._listener("/jax/core/compile/backend_compile_duration", 1.5, fun_name="jit(f)")
        compile_profile._listener("/jax/core/compile/backend_compile_duration", 0.5)
        compile_profile._listener("/jax/core/compile/jaxpr_trace_duration", 0.25)
        compile_profile._listener("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.25)
        compile_profile._listener("/jax/orbax/write/total_duration_secs", 7.0)  # not a compile event
    finally:
        compile_profile._current["sums"] = None
    assert sums == {"compile_s": 2.0, "compiles": 2, "trace_s": 0.5}


def test_the_summary_totals_the_tests_and_orders_files_by_wall_time():
    rows = [{"test": "tests/test_a.py::test_x", "wall_s": 3.0, "compile_s": 2.0, "compiles": 4},
            {"test": "tests/test_a.py::test_y", "wall_s": 1.0, "trace_s": 0.5},
            {"test": "tests/test_b.py::test_z", "wall_s": 10.0, "cache_saved_s": 1.0}]
    lines = compile_profile.summary(rows).splitlines()
    assert lines[0] == ("3 tests: 14 s, of it 2 s in 4 backend compiles and 0 s tracing and lowering; "
                        "the cache saved 1 s")
    assert lines[1].endswith("tests/test_b.py") and lines[2].endswith("tests/test_a.py")
    assert "compile     2.0 s      4" in lines[2]
