"""Builds the CPU kernels with the system C++ compiler: ``python -m cpu_kernels.build`` (run by scripts/install.sh).

Exits 0 with a note when the machine cannot build or run them (no compiler, no AVX512-BF16 / VNNI): jf-jax then uses
the plain-JAX references in XLA (same semantics, slower).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import jax

from cpu_kernels import library

FLAGS = ["-O3", "-std=c++17", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-fPIC",
         "-shared", "-w"]


def build(quiet: bool = False) -> bool:
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        print("cpu_kernels: no C++ compiler found; decoding will use XLA's dots", file=sys.stderr)
        return False
    library.LIBRARY.parent.mkdir(exist_ok=True)
    cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, library.SOURCES), "-o", str(library.LIBRARY)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"cpu_kernels: building {library.LIBRARY.name} failed; decoding uses XLA\n{proc.stderr[-2000:]}",
              file=sys.stderr)
        return False
    if not quiet:
        print(f"cpu_kernels: built {library.LIBRARY}")
    return True


if __name__ == "__main__":
    build()
