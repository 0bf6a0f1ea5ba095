"""Shared fixtures and lanes of the test suite.

Lanes: ``python -m pytest -q`` runs everything (CI); ``python -m pytest -q -m "not slow"`` is the development
lane (no real-weights model, no multi-device subprocess, no end-to-end training run).

Helpers that tests import (small random / predictable / Hugging Face / GGUF models) live in ``tests.support``;
the fixtures here are the ones several test modules share.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile

import pytest

# One persistent XLA compilation cache per test session (unless the caller names one): programs compiled again,
# after a module's caches are dropped (below) or in the subprocesses that CLI, multi-process and notebook tests
# start (they inherit the variable), load instead of compiling. A fresh directory each session, so every program
# is still compiled at least once per run.
_OWN_CACHE = None if "JAX_COMPILATION_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="jf_jax_xla_cache_")
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402  (after the environment above; the update below covers a jax imported by a plugin)

from jf_jax.weights import store  # noqa: E402
from tests.support.slow_tests import slow_test_ids  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


@pytest.fixture(autouse=True)
def _float32_matmuls_on_gpu(request):
    """On a GPU, tests of plain-JAX float32 arithmetic (forward parity, attention references) hold float32's
    tolerances, while JAX's default there is TF32 (~1e-3 relative): they run under full float32 matmuls. Tests
    marked ``library_precision`` (the decoders') do not: they see the precision the library sets itself
    (``model.decode_jit``), which is what a user gets. Nothing changes on a CPU."""
    if jax.default_backend() != "gpu" or request.node.get_closest_marker("library_precision"):
        yield
        return
    with jax.default_matmul_precision("float32"):
        yield


def require(module_name: str, reason: str | None = None):
    """The imported module ``module_name``, for a test dependency (torch, transformers, nbclient, ...).

    On a developer machine a missing module skips the calling test module (or test) with a reason, as
    ``pytest.importorskip`` does. Under CI (``CI=true``, which CI sets) it fails instead: a missing test dependency
    must not turn the parity tests into silent skips. Use it wherever ``pytest.importorskip`` would go.
    """
    if os.environ.get("CI") != "true":
        return pytest.importorskip(module_name, reason=reason)
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        error = e
    pytest.fail(f"test dependency {module_name!r} cannot be imported and CI=true, so this is a failure, not a skip "
                f"(install the test extras: pip install -e '.[test]'): {error}", pytrace=False)


@pytest.fixture
def cpu_kernels_run_here():
    """For a test of jf-jax's CPU kernels: skips it on a machine that cannot run them (backend, CPU features) and
    fails it on one that can but whose kernel library is missing or broken (``tests.support.kernel_gate``)."""
    from tests.support import kernel_gate

    kernel_gate.apply(kernel_gate.this_machine())


@pytest.fixture
def avx2_gemm_runs_here():
    """The same for the AVX2 set (``cpu_kernels.library.AVX2``: bf16 GEMM and decode attention): skips without
    AVX2 / FMA, fails when it could run but its library is missing or broken."""
    from tests.support import kernel_gate

    kernel_gate.apply(kernel_gate.this_machine("avx2"))


SLOW_FILES_FIRST = ("test_notebooks.py", "test_real_smollm2_decoding.py", "test_cached_attention.py", "test_cli.py",
                    "test_model_families.py", "test_sampling.py", "test_real_smollm2_logits.py",
                    "test_multiprocess.py", "test_study.py", "test_batched_recording.py")
"""The longest files (1-5 min each), first: xdist deals the first files out in turn (the notebooks' 3-minute
training test, which cannot be split, starts at once) and the short files then fill whichever worker is free."""


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    measured = slow_test_ids()  # the development lane leaves out what took 2 s or more in a measured run
    for item in items:
        if item.nodeid in measured:
            item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture
def weight_cache(tmp_path, monkeypatch):
    """A fresh, empty converted-weights cache for one test (nothing read from or written to ~/.cache)."""
    path = tmp_path / "weight_cache"
    monkeypatch.setenv(store.CACHE_ENV, str(path))
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A tiny llama GGUF file with tied embeddings and a chat template (``tests.support.gguf_models``)."""
    from tests.support.gguf_models import tiny_model, write_gguf

    return write_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", tiny_model("llama", tie=True, seed=3))


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct through the public API (decode view, float32), loaded once."""
    from jf_jax import api

    return api.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_bf16():
    """The embedded SmolLM2-135M-Instruct in bfloat16 through the public API, loaded once."""
    from jf_jax import api

    return api.load_model("smollm2-135m", dtype="bfloat16")


@pytest.fixture(scope="session")
def smollm2_int8():
    """The embedded SmolLM2-135M-Instruct with int8 (W8A8) matmuls through the public API, loaded once."""
    from jf_jax import api

    return api.load_model("smollm2-135m", dtype="int8")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops JAX's compiled programs after each test module: a full run otherwise keeps every module's executables
    alive in one process (suspected in the XLA compiler segfault seen late in full runs; see the README's Tests)."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
