"""The training scripts' glibc set-up (jf_jax/host_memory.py): the re-exec happens once, keeps the command line,
honours the opt-out and an existing GLIBC_TUNABLES, and really stops large freed blocks from being faulted in anew."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import jf_jax.host_memory as host_memory

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="GLIBC_TUNABLES exist only under glibc on Linux")

MODULE = Path(host_memory.__file__)

# Loads host_memory from its file (no jf_jax / JAX import), reports, re-executes, reports again; then allocates
# and frees (glibc's malloc / free, as XLA's allocations do) a 64 MiB block 20 times and prints the minor page
# faults that took.
SCRIPT = f"""
import importlib.util, os, resource, sys
spec = importlib.util.spec_from_file_location("host_memory", {str(MODULE)!r})
hm = importlib.util.module_from_spec(spec); spec.loader.exec_module(hm)
print("start", repr(os.environ.get("GLIBC_TUNABLES", "")), sys.argv[1:], flush=True)
hm.reexec_with_tuned_malloc()
import ctypes
libc = ctypes.CDLL("libc.so.6"); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]
def touch():  # what XLA does with a large temporary: allocate, write all of it, free
    p = libc.malloc(64 << 20); ctypes.memset(p, 1, 64 << 20); libc.free(p)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    touch()
print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, flush=True)
"""


def run(extra_env: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", host_memory.OPT_OUT)}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", SCRIPT, "a", "b c"], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.splitlines()


def faults(lines: list[str]) -> int:
    (line,) = [x for x in lines if x.startswith("faults")]
    return int(line.split()[1])


def test_reexecs_once_with_the_same_arguments_and_stops_refaulting():
    tuned = run({})
    assert tuned[:2] == ["start '' ['a', 'b c']", f"start {host_memory.TUNABLES!r} ['a', 'b c']"]
    assert len([x for x in tuned if x.startswith("start")]) == 2
    default = run({host_memory.OPT_OUT: "default"})
    assert default[0] == "start '' ['a', 'b c']" and len([x for x in default if x.startswith("start")]) == 1
    # 20 x 64 MiB of fresh pages is ~330,000 faults under glibc's defaults; the tunables keep the block.
    assert faults(default) > 100_000
    assert faults(tuned) < faults(default) / 10


def test_keeps_existing_tunables():
    lines = run({"GLIBC_TUNABLES": "glibc.malloc.check=0"})
    assert lines[1] == f"start {'glibc.malloc.check=0:' + host_memory.TUNABLES!r} ['a', 'b c']"


def test_train_command_reexecs_before_jax_is_imported():
    """The re-exec comes before JAX loads, so it is imported once, by the process that runs (``-X importtime`` is
    kept across the re-exec: both processes would list ``jax`` if the first had imported it). experiments/ablate.py
    follows the same pattern (its --help imports no JAX, so it is not checked this way)."""
    root = MODULE.parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", host_memory.OPT_OUT)}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "jf_jax.train", "--help"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    jax_imports = [ln for ln in proc.stderr.splitlines() if ln.split("|")[-1].strip() == "jax"]
    assert len(jax_imports) == 1, jax_imports
    assert "usage:" in proc.stdout
