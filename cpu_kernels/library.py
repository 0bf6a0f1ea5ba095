"""The compiled library of the CPU kernels: where it lives, whether it can run here, and its FFI targets.

One shared library holds every kernel (``python -m cpu_kernels.build`` compiles ``SOURCES`` into ``LIBRARY``);
loading it registers each handler with XLA under the name in ``TARGETS``. Whether the kernels run here has two
parts, kept apart because they mean different things: the machine (``machine_reason``: a CPU backend, a CPU with
``CPU_FLAGS_NEEDED``), a limit nothing fixes; and the library (``library_problem``: built, current, loadable), a
fault on a machine that could run them.
"""

from __future__ import annotations

import ctypes
import functools
import pathlib

import jax

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = (HERE / "bf16_gemm.cc", HERE / "int8_gemm.cc", HERE / "decode_attention.cc")
HEADERS = (HERE / "common.h",)
LIBRARY = HERE / "_build" / "libjf_cpu_kernels.so"
TARGETS = {  # FFI target name -> exported handler symbol
    "jf_bf16_gemm": "JfBf16Gemm",
    "jf_w8a8_bf16": "JfW8A8Bf16",
    "jf_w8a8_f32": "JfW8A8F32",
    "jf_decode_attention_bf16": "JfDecodeAttentionBf16",
    "jf_decode_attention_f32": "JfDecodeAttentionF32",
}


CPU_FLAGS_NEEDED = ("avx512_bf16", "avx512_vnni")
"""The instruction-set extensions (as /proc/cpuinfo names them) the kernels are compiled for (``build.FLAGS``)."""
CPUINFO = pathlib.Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The CPU's feature flags from the text of /proc/cpuinfo (read here when not given); None when unknown (not
    Linux, or no flags line)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def machine_reason(backend: str, flags: frozenset[str] | None) -> str | None:
    """Why this machine cannot run the kernels whatever is built (None when it can): the backend and the CPU's
    features alone. A capable machine whose library is missing or broken is a fault to fix, not a limit
    (``library_problem``)."""
    if backend != "cpu":
        return f"JAX runs on {backend}; the kernels are for CPUs"
    if flags is None:
        return "cannot read /proc/cpuinfo to check for AVX512-BF16"
    missing = [f for f in CPU_FLAGS_NEEDED if f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    return None


def library_problem(load: bool = True) -> str | None:
    """What is wrong with the compiled library (None when it is built, current and, with ``load``, loads with every
    handler; a CPU without the kernels' instructions should not ``load`` it)."""
    if not LIBRARY.exists():
        return f"{LIBRARY} is not built (python -m cpu_kernels.build)"
    if any(LIBRARY.stat().st_mtime < source.stat().st_mtime for source in SOURCES + HEADERS):
        return f"{LIBRARY} is older than its sources (python -m cpu_kernels.build)"
    if not load:
        return None
    try:
        library = ctypes.cdll.LoadLibrary(str(LIBRARY))
        missing = [symbol for symbol in TARGETS.values() if not hasattr(library, symbol)]
    except OSError as e:
        return f"{LIBRARY} does not load ({e}; python -m cpu_kernels.build)"
    if missing:
        return f"{LIBRARY} lacks {', '.join(missing)} (python -m cpu_kernels.build)"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """Why the kernels cannot run in this process (None when they can; they are then registered with XLA)."""
    reason = machine_reason(jax.default_backend(), cpu_flags()) or library_problem()
    if reason is None:
        library = ctypes.cdll.LoadLibrary(str(LIBRARY))
        for target, symbol in TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return reason


def available() -> bool:
    return unavailable_reason() is None
