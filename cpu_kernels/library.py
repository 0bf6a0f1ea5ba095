"""The compiled library of the CPU kernels: where it lives, whether it can run here, and its FFI targets.

One shared library holds every kernel (``python -m cpu_kernels.build`` compiles ``SOURCES`` into ``LIBRARY``);
loading it registers each handler with XLA under the name in ``TARGETS``.
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


@functools.cache
def unavailable_reason() -> str | None:
    """Why the kernels cannot run in this process (None when they can; they are then registered with XLA)."""
    if jax.default_backend() != "cpu":
        return f"JAX runs on {jax.default_backend()}; the kernels are for CPUs"
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX512-BF16"
    missing = [f for f in ("avx512_bf16", "avx512_vnni") if f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    if not LIBRARY.exists():
        return f"{LIBRARY} is not built (python -m cpu_kernels.build)"
    if any(LIBRARY.stat().st_mtime < source.stat().st_mtime for source in SOURCES + HEADERS):
        return f"{LIBRARY} is older than its sources (python -m cpu_kernels.build)"
    library = ctypes.cdll.LoadLibrary(str(LIBRARY))
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return None


def available() -> bool:
    return unavailable_reason() is None
