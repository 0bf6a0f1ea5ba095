"""Builds the CPU kernels with the system C++ compiler: ``python -m cpu_kernels.build`` (run by scripts/install.sh).

Every kernel set of ``library.KERNEL_SETS`` is compiled into its own library, whatever this CPU runs (compiling
needs only the compiler), so a machine builds what it can use and a test can check what each library contains.
``--compiler PATH`` names the compiler (default: the first of g++, c++, clang++ on the PATH).

The exit status follows ``library``'s split between a limit and a fault. A set this machine cannot run (its CPU
lacks the set's instructions, or ``JF_CPU_KERNELS`` leaves it out: ``library.machine_reason``) would never be
loaded here, so its failed build is reported on stderr and the exit status stays 0; so is a machine that runs no
set at all (not x86, or too old a CPU), with or without a compiler: nothing it could build would be used. A set
this machine could run that does not build (the compiler's message is printed), or no compiler to build it, exits
1: decoding would silently fall back to XLA's slower dots, and the kernel tests fail on such a machine
(tests/support/kernel_gate.py), so the install must stop there rather than pass. ``JF_CPU_KERNELS=none`` installs
without the kernels on purpose.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys

import jax

from cpu_kernels import library

COMMON_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-w")
X86 = ("x86_64", "amd64", "i686", "i386")  # platform.machine() of the machines the kernels' intrinsics compile on


def compile_set(compiler: str, kernel_set: library.KernelSet) -> str | None:
    """Compiles ``kernel_set`` into its library; None when built, else why not (the end of the compiler's stderr)."""
    path = kernel_set.library
    path.parent.mkdir(exist_ok=True)
    cmd = [compiler, *COMMON_FLAGS, *kernel_set.compile_flags, f"-I{jax.ffi.include_dir()}",
           *map(str, kernel_set.sources), "-o", str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:  # a --compiler that does not exist or cannot be run
        return f"cannot run {compiler}: {e.strerror or e}"
    if proc.returncode != 0:
        return proc.stderr[-2000:].strip() or f"{compiler} exited with status {proc.returncode} and no message"
    return None


def machine_reason(kernel_set: library.KernelSet) -> str | None:
    """Why this machine would never run ``kernel_set`` (None when it would): its CPU and ``JF_CPU_KERNELS``. The
    backend is taken as "cpu": the kernels are CPU code, and any process here may run JAX on the CPU."""
    return library.machine_reason("cpu", library.cpu_flags(), kernel_set, library.chosen_sets())


def build_set(compiler: str, kernel_set: library.KernelSet, quiet: bool = False) -> bool:
    """Builds ``kernel_set``; False when that failed on a machine that could run it (a fault), True otherwise."""
    error = compile_set(compiler, kernel_set)
    if error is None:
        if not quiet:
            print(f"cpu_kernels: built {kernel_set.library}")
        return True
    reason = machine_reason(kernel_set)
    consequence = (f"skipped: this machine would not run it ({reason})" if reason else
                   "this CPU could run it: an error (decoding would fall back to XLA's slower dots)")
    print(f"cpu_kernels: building {kernel_set.library.name} failed; {consequence}\n{error}", file=sys.stderr)
    return reason is not None


def build(quiet: bool = False, compiler: str | None = None) -> int:
    """Builds every kernel set; returns the exit status (the module docstring says when it is not 0)."""
    if platform.machine().lower() not in X86:
        print(f"cpu_kernels: the kernels are x86 code and this machine is {platform.machine()}; decoding will use "
              "XLA's dots", file=sys.stderr)
        return 0
    compiler = compiler or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        runnable = [s.name for s in library.KERNEL_SETS if machine_reason(s) is None]
        if not runnable:
            print("cpu_kernels: no C++ compiler found, and this machine runs none of the kernel sets; decoding will "
                  "use XLA's dots", file=sys.stderr)
            return 0
        print(f"cpu_kernels: error: no C++ compiler found (g++, c++ or clang++), and this CPU could run the "
              f"{', '.join(runnable)} kernels; install one, or set {library.CHOICE_VARIABLE}=none to go without the "
              "kernels", file=sys.stderr)
        return 1
    return 0 if all([build_set(compiler, kernel_set, quiet) for kernel_set in library.KERNEL_SETS]) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpu_kernels.build", description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", help="the C++ compiler (default: g++, c++ or clang++ from the PATH)")
    parser.add_argument("--quiet", action="store_true", help="report failures only")
    args = parser.parse_args(argv)
    try:
        return build(args.quiet, args.compiler)
    except ValueError as e:  # a JF_CPU_KERNELS value library does not know
        print(f"cpu_kernels: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
