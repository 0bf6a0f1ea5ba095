"""glibc's allocator set up for long CPU training runs: the program re-executes itself with ``GLIBC_TUNABLES``.

Why: XLA:CPU allocates a step's large buffers afresh on every call (the layer scan's zero-filled gradient stacks,
the [B, L, V] logits, the optimizer's outputs). glibc serves blocks above 32 MiB with ``mmap`` and unmaps them
when they are freed, so every train step touches new pages that the kernel must fault in and zero: ~300,000 minor
page faults (~1.2 GB) per step of SmolLM2 at batch 1, measured with ``getrusage``. With ``TUNABLES`` freed memory
stays in the process (no ``mmap``, one arena, no trimming) and is backed by transparent huge pages: ~900 faults
per step, and the bfloat16 + remat step at batch 4 took 1.50 / 1.64 s per example against 1.71 / 2.19 s without
them, run alternately (results/studies/train_step_speed/train_step_batch.md). The price is that the process
keeps its peak heap (its resident size was 1-3 GB higher in those runs). glibc reads tunables only when a program
starts, so the setting takes a re-exec; ``JF_JAX_MALLOC=default`` opts out. Nothing here changes any computed value.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1"
            ":glibc.malloc.trim_threshold=4000000000")
OPT_OUT = "JF_JAX_MALLOC"
"""Environment variable: ``default`` keeps glibc's own settings."""


def wanted() -> bool:
    """Whether this process should run under ``TUNABLES`` and does not yet."""
    if os.environ.get(OPT_OUT) == "default":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    return TUNABLES not in os.environ.get("GLIBC_TUNABLES", "")


def reexec_with_tuned_malloc() -> None:
    """Replaces this process by the same command line (interpreter flags included) under ``TUNABLES``; returns at
    once when they are in force already, when ``JF_JAX_MALLOC=default``, or off Linux/glibc. Call it first thing in
    a script's ``__main__`` block, never from library code: it does not return when it re-executes."""
    if not wanted():
        return
    current = os.environ.get("GLIBC_TUNABLES", "")
    env = dict(os.environ, GLIBC_TUNABLES=":".join(t for t in (current, TUNABLES) if t))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
