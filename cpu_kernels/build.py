"""Builds the CPU kernels with the system C++ compiler: ``python -m cpu_kernels.build`` (run by scripts/install.sh).

Every kernel set of ``library.KERNEL_SETS`` is compiled into its own library, whatever this CPU runs (compiling
needs only the compiler), so a machine builds what it can use and a test can check what each library contains.
A set that fails to build is reported on stderr; jf-jax then uses the plain-JAX references in XLA (same semantics,
slower) wherever that set would have run. Exits 0 either way, so an install goes on without the kernels.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys

import jax

from cpu_kernels import library

COMMON_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-w")
X86 = ("x86_64", "amd64", "i686", "i386")  # platform.machine() of the machines the kernels' intrinsics compile on


def build_set(compiler: str, kernel_set: library.KernelSet, quiet: bool = False) -> bool:
    path = kernel_set.library
    path.parent.mkdir(exist_ok=True)
    cmd = [compiler, *COMMON_FLAGS, *kernel_set.compile_flags, f"-I{jax.ffi.include_dir()}",
           *map(str, kernel_set.sources), "-o", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"cpu_kernels: building {path.name} failed; decoding uses XLA where its kernels would run\n"
              f"{proc.stderr[-2000:]}", file=sys.stderr)
        return False
    if not quiet:
        print(f"cpu_kernels: built {path}")
    return True


def build(quiet: bool = False) -> bool:
    """Builds every kernel set; True when all were built."""
    if platform.machine().lower() not in X86:
        print(f"cpu_kernels: the kernels are x86 code and this machine is {platform.machine()}; decoding will use "
              "XLA's dots", file=sys.stderr)
        return False
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        print("cpu_kernels: no C++ compiler found; decoding will use XLA's dots", file=sys.stderr)
        return False
    return all([build_set(compiler, kernel_set, quiet) for kernel_set in library.KERNEL_SETS])


if __name__ == "__main__":
    build()
