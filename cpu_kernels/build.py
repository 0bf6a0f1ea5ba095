"""Builds the CPU kernels with the system C++ compiler: ``python -m cpu_kernels.build`` (run by scripts/install.sh).

Exits 0 with a note when the machine cannot build or run them (no compiler, no AVX512-BF16): jf-jax then uses
XLA's own dots, which give the same results, more slowly.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import jax

from cpu_kernels import bf16_gemm

SOURCE = pathlib.Path(__file__).resolve().parent / "bf16_gemm.cc"
FLAGS = ["-O3", "-std=c++17", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fPIC", "-shared", "-w"]


def build(quiet: bool = False) -> bool:
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        print("cpu_kernels: no C++ compiler found; decoding will use XLA's dots", file=sys.stderr)
        return False
    bf16_gemm.LIBRARY.parent.mkdir(exist_ok=True)
    cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(bf16_gemm.LIBRARY)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"cpu_kernels: building {SOURCE.name} failed; decoding will use XLA's dots\n{proc.stderr[-2000:]}",
              file=sys.stderr)
        return False
    if not quiet:
        print(f"cpu_kernels: built {bf16_gemm.LIBRARY}")
    return True


if __name__ == "__main__":
    build()
