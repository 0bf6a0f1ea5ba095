"""The compiled libraries of the CPU kernels: where they live, whether they can run here, and their FFI targets.

The kernels come in two sets, each one shared library (``python -m cpu_kernels.build`` compiles every set):
``AVX512`` (the bf16 GEMM and the W8A8 matmul, for CPUs with AVX512-BF16 and VNNI) and ``AVX2`` (a bf16 GEMM,
decode attention and the KV-cache write, for CPUs with AVX2 and FMA, the x86 baseline of the last decade, which
AVX-512 CPUs run too). Loading a set registers each of its
handlers with XLA under the name in its ``targets``. Whether a set runs here has two parts, kept apart because
they mean different things: the machine (``machine_reason``: a CPU backend, a CPU with the set's instructions), a
limit nothing fixes; and the library (``library_problem``: built, current, loadable), a fault on a machine that
could run it.

``JF_CPU_KERNELS`` (read once, when first needed) limits the sets a process may use: ``all`` (the default),
``avx2`` (the AVX2 set only: the engine of an AVX2-only CPU, for tests and measurements on a larger one) or
``none`` (XLA's dots everywhere).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import pathlib

import jax

HERE = pathlib.Path(__file__).resolve().parent
HEADERS = (HERE / "common.h", HERE / "decode_attention_call.h", HERE / "bf16_gemm_avx2_block.h")
CPUINFO = pathlib.Path("/proc/cpuinfo")
CHOICE_VARIABLE = "JF_CPU_KERNELS"
CHOICES = {"all": ("avx512", "avx2"), "avx2": ("avx2",), "none": ()}


@dataclasses.dataclass(frozen=True)
class KernelSet:
    """Kernels compiled together for one instruction set."""

    name: str
    sources: tuple[pathlib.Path, ...]
    cpu_flags_needed: tuple[str, ...]
    """The instruction-set extensions (as /proc/cpuinfo names them) the set is compiled for (``compile_flags``)."""
    compile_flags: tuple[str, ...]
    targets: tuple[tuple[str, str], ...]
    """(FFI target name, exported handler symbol) of each kernel."""

    @property
    def library(self) -> pathlib.Path:
        return HERE / "_build" / f"libjf_cpu_kernels_{self.name}.so"


AVX512 = KernelSet("avx512", (HERE / "bf16_gemm.cc", HERE / "int8_gemm.cc"),
                   ("avx512_bf16", "avx512_vnni"),
                   ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni"),
                   (("jf_bf16_gemm", "JfBf16Gemm"), ("jf_w8a8_bf16", "JfW8A8Bf16"), ("jf_w8a8_f32", "JfW8A8F32")))
AVX2 = KernelSet("avx2", (HERE / "bf16_gemm_avx2.cc", HERE / "decode_attention_avx2.cc", HERE / "cache_write.cc"),
                 ("avx2", "fma"), ("-mavx2", "-mfma"),
                 (("jf_bf16_gemm_avx2", "JfBf16GemmAvx2"), ("jf_cache_write", "JfCacheWrite"),
                  ("jf_decode_attention_avx2_bf16", "JfDecodeAttentionAvx2Bf16"),
                  ("jf_decode_attention_avx2_f32", "JfDecodeAttentionAvx2F32")))
KERNEL_SETS = (AVX512, AVX2)


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


@functools.cache
def chosen_sets() -> tuple[str, ...]:
    """The names of the sets ``JF_CPU_KERNELS`` lets this process use (all of them when it is unset), read once, so
    what the process reports (``jf_jax.model.machine.detect``) is what it runs."""
    choice = os.environ.get(CHOICE_VARIABLE, "all")
    if choice not in CHOICES:
        raise ValueError(f"{CHOICE_VARIABLE}={choice!r}; expected one of {', '.join(CHOICES)}")
    return CHOICES[choice]


def machine_reason(backend: str, flags: frozenset[str] | None, kernel_set: KernelSet = AVX512,
                   chosen: tuple[str, ...] = CHOICES["all"]) -> str | None:
    """Why this machine cannot run ``kernel_set`` whatever is built (None when it can): the backend, the CPU's
    features and the sets the process may use (``chosen_sets``). A capable machine whose library is missing or
    broken is a fault to fix, not a limit (``library_problem``)."""
    if kernel_set.name not in chosen:
        return f"this process leaves out the {kernel_set.name} kernels ({CHOICE_VARIABLE}={'/'.join(chosen) or 'none'})"
    if backend != "cpu":
        return f"JAX runs on {backend}; the kernels are for CPUs"
    if flags is None:
        return f"cannot read /proc/cpuinfo to check for {kernel_set.cpu_flags_needed[0].upper().replace('_', '-')}"
    missing = [f for f in kernel_set.cpu_flags_needed if f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    return None


def library_problem(load: bool = True, kernel_set: KernelSet = AVX512) -> str | None:
    """What is wrong with ``kernel_set``'s compiled library (None when it is built, current and, with ``load``,
    loads with every handler; a CPU without the set's instructions should not ``load`` it)."""
    path = kernel_set.library
    if not path.exists():
        return f"{path} is not built (python -m cpu_kernels.build)"
    if any(path.stat().st_mtime < source.stat().st_mtime for source in kernel_set.sources + HEADERS):
        return f"{path} is older than its sources (python -m cpu_kernels.build)"
    if not load:
        return None
    try:
        loaded = ctypes.cdll.LoadLibrary(str(path))
        missing = [symbol for _, symbol in kernel_set.targets if not hasattr(loaded, symbol)]
    except OSError as e:
        return f"{path} does not load ({e}; python -m cpu_kernels.build)"
    if missing:
        return f"{path} lacks {', '.join(missing)} (python -m cpu_kernels.build)"
    return None


@functools.cache
def unavailable_reason(kernel_set: KernelSet = AVX512) -> str | None:
    """Why ``kernel_set`` cannot run in this process (None when it can; its kernels are then registered with XLA)."""
    reason = (machine_reason(jax.default_backend(), cpu_flags(), kernel_set, chosen_sets())
              or library_problem(kernel_set=kernel_set))
    if reason is None:
        loaded = ctypes.cdll.LoadLibrary(str(kernel_set.library))
        for target, symbol in kernel_set.targets:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(loaded, symbol)), platform="cpu")
    return reason


def this_process(kernel_set: KernelSet) -> tuple[str | None, str | None]:
    """(``machine_reason``, ``library_problem``) of ``kernel_set`` in this process: its backend, CPU and chosen sets;
    the library is loaded (and its kernels registered, as decoding would) only where the machine can run it."""
    reason = machine_reason(jax.default_backend(), cpu_flags(), kernel_set, chosen_sets())
    return reason, library_problem(load=False, kernel_set=kernel_set) if reason else unavailable_reason(kernel_set)


def available(kernel_set: KernelSet = AVX512) -> bool:
    return unavailable_reason(kernel_set) is None
