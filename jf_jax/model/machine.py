"""What this machine gives the decode engine, and what follows from it: the path each dtype's decode takes here,
where jacobi / mr == AR has been shown, and the dtype ``auto`` picks.

``detect()`` reads the machine once into a ``Machine`` (JAX backend and devices, CPU model and feature flags,
whether ``cpu_kernels`` run). Everything else is a pure function of a ``Machine``, so a test can hand it any
backend and feature set, and ``python -m jf_jax.doctor`` and the decode CLI say the same thing.

The rule of ``auto`` (``choose_dtype``): of the dtypes that keep the model (float32, bfloat16; int8 is a lossy
approximation of it and never chosen), take the fastest on this machine (``fastest_first``) among those whose
lossless decoding has been shown on this class of machine (``LOSSLESS``, ``evidence_class``); where none has been,
float32, the reference.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import jax

from cpu_kernels import library
from jf_jax.model.decode_view import DecodeView, decode_view
from jf_jax.model.params import Params

DTYPES = ("float32", "bfloat16", "int8")
CPU_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
                "amx_bf16", "amx_int8")
"""The /proc/cpuinfo flags that decide a CPU decode's speed: XLA's f32 and bf16 dots (avx2/fma/avx512f), jf-jax's
kernels (avx512_bf16/avx512_vnni; avx2/fma for the AVX2 GEMM), and what XLA's own bf16 and int8 kernels may use
(avx_vnni, amx)."""

# Where jacobi and mr decoding have been shown to return AR's tokens, per (machine class, dtype): the README's
# device table, keyed by what the evidence was gathered on (``evidence_class``), not by backend alone, so an ARM
# CPU or an untried GPU does not inherit another machine's proof. int8 is shown against its own int8 AR.
X86_AVX2 = "x86 CPU with AVX2 and FMA"
"""Every CPU the decoding tests passed on (AVX2-only AMD EPYCs, AVX512-BF16 and AMX Xeons) has both."""
CPU_TESTS = ("tests/test_real_smollm2_decoding.py and the decoding tests, bit-equal logits and equal tokens, on "
             "AVX2-only (the AVX2 kernels), AVX512-BF16 and AMX x86 CPUs (README's device table)")
H100, H200 = "NVIDIA H100", "NVIDIA H200"
LOSSLESS = {
    (X86_AVX2, "float32"): f"tested: {CPU_TESTS}",
    (X86_AVX2, "bfloat16"): f"tested: {CPU_TESTS}",
    (X86_AVX2, "int8"): f"tested against int8 AR: {CPU_TESTS}",
    (H100, "float32"): "shown on an NVIDIA H100: 48 of 48 decodes token-equal to AR (results/gpu_smollm2_jf_n16/"
                       "speed_float32.md)",
}
NOT_LOSSLESS = {
    (H100, "bfloat16"): "NOT shown on every held-out prompt: on NVIDIA H100s at the fixed decode shape "
                        "(--decode-shape auto, the GPU default) jacobi and mr equalled AR's tokens on every prompt "
                        "evaluated, 36 of 36 for the base SmolLM2 and 48 of 48 each for it and two trained models "
                        "(results/studies/data_scale/gpu/README.md), two runs, a third of the held-out sets; at each "
                        "forward's own shape 0-75% of prompts per set (docs/gpu-tpu.md, 'Lossless on a GPU')",
    (H200, "bfloat16"): "NOT shown on a prompt set: on an NVIDIA H200 at the fixed decode shape 4x128, jacobi and mr "
                        "equalled AR's tokens on 2 of 2 prompts of a random 7B-shaped model "
                        "(results/studies/gpu_h200_7b/README.md)",
}


def evidence_class(machine: "Machine") -> str:
    """The class of machine whose evidence applies here: x86 CPUs with AVX2 and FMA, a named GPU (H100, H200), or
    else the device itself (ARM CPUs, CPUs of unknown features, other GPUs, TPUs), for which nothing is shown."""
    if machine.backend == "cpu":
        flags = machine.cpu_flags
        if flags is None:
            return "CPU of unknown features"
        return X86_AVX2 if {"avx2", "fma"} <= flags else "CPU without AVX2 and FMA (ARM, or an older x86)"
    kind = machine.devices[0] if machine.devices else machine.backend
    return next((name for name in (H100, H200) if name.upper() in kind.upper()), kind)


@dataclasses.dataclass(frozen=True)
class Machine:
    """The facts ``detect`` reads; a test builds one by hand."""

    backend: str
    """``jax.default_backend()``: cpu, gpu or tpu."""
    devices: tuple[str, ...] = ()
    """The device kind of each JAX device."""
    cpu_model: str | None = None
    cpu_flags: frozenset[str] | None = None
    """The CPU's feature flags (/proc/cpuinfo); None when unknown (not Linux)."""
    cores: int = 1
    avx512_machine_reason: str | None = None
    """Why this machine cannot run the AVX-512 kernels (``library.AVX512``) whatever is built
    (``library.machine_reason``); None: it can."""
    avx512_library_problem: str | None = None
    """What is wrong with their compiled library (``library.library_problem``); None: nothing."""
    avx2_machine_reason: str | None = "not looked for"
    """Why this machine cannot run the AVX2 GEMM (``library.AVX2``); None: it can. ``detect`` always looks."""
    avx2_library_problem: str | None = None
    """What is wrong with the AVX2 GEMM's library; None: nothing."""

    @property
    def avx512_kernels_run(self) -> bool:
        """The AVX-512 kernels run: bf16 GEMM and W8A8 matmul."""
        return self.avx512_machine_reason is None and self.avx512_library_problem is None

    @property
    def avx2_gemm_runs(self) -> bool:
        """The AVX2 set runs: its bf16 GEMM, decode attention and cache write (the name predates the last two)."""
        return self.avx2_machine_reason is None and self.avx2_library_problem is None

    @property
    def packs_bf16(self) -> bool:
        """A bf16 GEMM kernel runs, so bf16 weights are packed for it at load (``jf_jax.api.load_model``)."""
        return self.avx512_kernels_run or self.avx2_gemm_runs

    def features(self) -> dict[str, bool] | None:
        """Each of ``CPU_FEATURES``: present or not; None when the flags are unknown."""
        return None if self.cpu_flags is None else {f: f in self.cpu_flags for f in CPU_FEATURES}


def _cpuinfo_fields(cpuinfo: str | None) -> dict[str, str]:
    """The first value of each field of /proc/cpuinfo's text (read here when not given; {} when unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path(library.CPUINFO).read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model(cpuinfo: str | None = None) -> str | None:
    """The "model name" of /proc/cpuinfo (read here when not given); None when unknown."""
    return _cpuinfo_fields(cpuinfo).get("model name")


def cpu_kind(cpuinfo: str | None = None, cores: int | None = None) -> str:
    """This CPU as a measurement names it: its model name with family and model (one "AMD EPYC" covers several
    generations), its vector instruction set and its cores, e.g. "AMD EPYC (family 26, model 2, AVX-512 + BF16),
    2 cores"; "unknown CPU" where /proc/cpuinfo cannot be read."""
    info = _cpuinfo_fields(cpuinfo)
    flags = set(info.get("flags", "").split())
    isa = ("AVX-512 + BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
           else "AVX2" if "avx2" in flags else "no AVX2")
    cores = cores or len(os.sched_getaffinity(0))
    if "model name" not in info:
        return f"unknown CPU, {cores} cores"
    return (f"{info['model name']} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}, {isa}"
            f"{', AMX' if 'amx_tile' in flags else ''}), {cores} cores")


def detect() -> Machine:
    """This process's machine. Starts JAX's default backend; loads a kernel library only on a CPU that can run
    it (through ``library.unavailable_reason``, which also registers the kernels, as decoding would)."""
    (reason, problem), (avx2_reason, avx2_problem) = map(library.this_process, (library.AVX512, library.AVX2))
    return Machine(backend=jax.default_backend(), devices=tuple(d.device_kind for d in jax.devices()),
                   cpu_model=cpu_model(), cpu_flags=library.cpu_flags(), cores=os.cpu_count() or 1,
                   avx512_machine_reason=reason, avx512_library_problem=problem,
                   avx2_machine_reason=avx2_reason, avx2_library_problem=avx2_problem)


@dataclasses.dataclass(frozen=True)
class EnginePath:
    """How a decode step of one dtype runs on a machine."""

    dtype: str
    summary: str
    """One line for a header: the dtype and what runs its matmuls."""
    matmuls: str
    attention: str
    note: str | None = None
    """What the user should know (a slow path, a fix)."""


def kernels_absent(machine: Machine, flag: str = "avx512_bf16") -> str:
    """Why jf-jax's AVX-512 kernels do not run, in a few words for a header (``avx512_kernels_run`` must be False); a
    missing ``flag`` (the one the dtype's kernel is named after) is named first."""
    if machine.avx512_machine_reason is None:
        return "kernel library unavailable: python -m cpu_kernels.build"
    if machine.cpu_flags is None:
        return "CPU features unknown"
    missing = sorted((f for f in library.AVX512.cpu_flags_needed if f not in machine.cpu_flags),
                     key=lambda f: f != flag)
    if not missing:  # a capable CPU whose process left the set out
        return f"left out by {library.CHOICE_VARIABLE}"
    return "no " + " or ".join(f.upper().replace("_", "-") for f in missing)


MAX_COLUMN_SHARDS = 8


def default_column_shards(backend: str, cores: int) -> int:
    """Shards per matmul weight in the decode view: one per core on a CPU (one XLA dot uses one core), at most
    ``MAX_COLUMN_SHARDS``; 1 elsewhere."""
    return max(1, min(cores, MAX_COLUMN_SHARDS)) if backend == "cpu" else 1


@dataclasses.dataclass(frozen=True)
class ViewLayout:
    """The layout arguments of ``model.decode_view.decode_view``: weights in ``column_shards`` shards, packed for
    the bf16 GEMM kernel (``pack``) or quantised (``int8``)."""

    column_shards: int = 1
    pack: bool = False
    int8: bool = False

    def build(self, params: Params) -> DecodeView:
        """The decode view of the stacked ``params`` in this layout."""
        return decode_view(params, column_shards=self.column_shards, pack=self.pack, int8=self.int8)


def decode_view_for(machine: Machine, dtype: str, column_shards: int | None = None) -> ViewLayout:
    """The decode view a model in ``dtype`` is held in on ``machine`` (``jf_jax.api.load_model`` builds it,
    ``engine_path`` names it, the doctor's check decodes on it): int8 matmul weights for int8; bf16 weights packed
    for the GEMM kernel when one runs here and no ``column_shards`` are asked for; else every matmul weight in
    ``column_shards`` shards (default ``default_column_shards``)."""
    if dtype == "int8":
        if column_shards not in (None, 1):
            raise ValueError("int8 weights are not split in column shards")
        return ViewLayout(int8=True)
    if dtype == "bfloat16" and column_shards is None and machine.packs_bf16:
        return ViewLayout(pack=True)
    if column_shards is None:
        column_shards = default_column_shards(machine.backend, machine.cores)
    return ViewLayout(column_shards=column_shards)


def engine_path(machine: Machine, dtype: str) -> EnginePath:
    """The path a decode in ``dtype`` takes on ``machine``: what runs the matmuls of the view ``decode_view_for``
    picks there."""
    short = {"float32": "f32", "bfloat16": "bf16", "int8": "int8"}[dtype]
    if machine.backend != "cpu":
        return EnginePath(dtype, f"{short} via XLA on {machine.backend}", f"XLA dots on {machine.backend}",
                          "plain JAX (jf_jax/model/cached_attention.py) in XLA")
    layout = decode_view_for(machine, dtype)
    attention = ("jf-jax decode-attention kernel (AVX2 set)" if machine.avx2_gemm_runs
                 else "plain JAX in XLA (the kernel's twin; "
                 f"{machine.avx2_machine_reason or machine.avx2_library_problem})")
    if layout.int8:
        if machine.avx512_kernels_run:
            return EnginePath(dtype, "int8 via jf-jax AVX512-VNNI kernels", "jf-jax W8A8 kernel (exact int32 sums)",
                              attention)
        return EnginePath(dtype, f"int8 via XLA integer dots ({kernels_absent(machine, 'avx512_vnni')})",
                          "the W8A8 kernel's plain-JAX twin in XLA", attention,
                          "slow without the VNNI kernel: on a 2-core AVX2-only CPU int8 AR ran at a quarter of "
                          "bfloat16's (results/studies/decode_engine_speed/dtypes_epyc_cache_write.json)")
    if layout.pack and machine.avx512_kernels_run:
        return EnginePath(dtype, "bf16 via jf-jax AVX512-BF16 kernels",
                          "jf-jax bf16 GEMM kernel on weights packed at load", attention)
    sharded = "XLA dots, each weight in one column shard per core"
    if dtype == "float32":
        return EnginePath(dtype, "f32 via XLA dots", sharded, attention)
    note = (f"the faster AVX512-BF16 kernels would run here: {machine.avx512_library_problem}"
            if machine.avx512_machine_reason is None else None)
    if layout.pack:  # the AVX2 GEMM, the one that runs where the AVX-512 set does not
        return EnginePath(dtype, f"bf16 via the jf-jax AVX2 GEMM kernel ({kernels_absent(machine)})",
                          "jf-jax AVX2/FMA bf16 GEMM kernel on weights packed at load", attention, note)
    if note is None and machine.avx2_machine_reason is None:
        note = f"the packed bf16 GEMM kernel would run here: {machine.avx2_library_problem}"
    return EnginePath(dtype, f"bf16 via XLA dots ({kernels_absent(machine)})", sharded, attention, note)


def lossless_evidence(machine: "Machine", dtype: str) -> str:
    """Where jacobi / mr == AR has been shown for ``dtype`` on ``machine``'s class (or that it has not)."""
    key = (evidence_class(machine), dtype)
    return (LOSSLESS.get(key) or NOT_LOSSLESS.get(key)
            or f"not shown: no run on a {key[0]} in {dtype} is recorded (python -m jf_jax.doctor --check tests it "
               "here)")


def fastest_first(machine: Machine) -> tuple[tuple[str, str], ...]:
    """The model-keeping dtypes, fastest first on ``machine``, each with the measurement that places it."""
    if machine.backend == "cpu" and machine.avx512_kernels_run:
        return (("bfloat16", "bf16 AR ran at 2.8x float32 AR and 0.67x int8 AR (int8 changes the model) through the "
                             "packed kernels on a 2-core AVX512-BF16 Xeon "
                             "(results/studies/decode_engine_speed/bench_engine_xeon_fma.md)"),
                ("float32", "the reference"))
    if machine.backend == "cpu" and machine.avx2_gemm_runs:
        return (("bfloat16", "bf16 AR through the AVX2 kernels ran at 3.1x float32 AR and 4.2x int8 AR on a "
                             "2-core AVX2-only AMD EPYC "
                             "(results/studies/decode_engine_speed/dtypes_epyc_cache_write.json)"),
                ("float32", "the reference"))
    if machine.backend == "cpu":
        # Without the kernels both dtypes run XLA's dots. bf16 reads half the weight bytes, and on the AVX2-only
        # CPU it was as fast as float32 or faster in each of three runs. Not measured on an AVX512-BF16 CPU whose
        # library is missing (a fault the header names) nor on a CPU of unknown features (not x86 Linux): the same
        # byte argument holds there.
        return (("bfloat16", "bf16 AR ran 5-33% faster than float32 AR through XLA's dots on a 2-core AVX2-only "
                             "CPU (results/studies/decode_engine_speed/README.md, dtypes_avx2.json)"),
                ("float32", "the reference"))
    if machine.backend == "gpu":
        return (("bfloat16", "bf16 AR ran at 1.2-1.3x float32 AR on an NVIDIA H100 (results/gpu_smollm2_jf_n16/"
                             "speed.md, speed_float32.md)"),
                ("float32", "the reference"))
    return (("bfloat16", f"not measured on {machine.backend}; half the bytes of float32"), ("float32", "the reference"))


@dataclasses.dataclass(frozen=True)
class DtypeChoice:
    dtype: str
    requested: str
    reason: str


def choose_dtype(requested: str, machine: Machine | None = None) -> DtypeChoice:
    """``requested`` itself, or for "auto" the fastest dtype whose lossless decoding is shown on this backend
    (the module's rule). ``machine`` defaults to ``detect()``."""
    if requested != "auto":
        if requested not in DTYPES:
            raise ValueError(f"unknown dtype {requested!r}; expected auto or one of {', '.join(DTYPES)}")
        return DtypeChoice(requested, requested, "asked for")
    machine = detect() if machine is None else machine
    ranked = fastest_first(machine)
    where = evidence_class(machine)
    for rank, (dtype, speed) in enumerate(ranked):
        if (where, dtype) in LOSSLESS:
            if rank == 0:
                return DtypeChoice(dtype, "auto", f"the fastest dtype here, and shown lossless on a {where}: {speed}")
            passed = "; ".join(f"{d} is faster ({why}) but lossless decoding is {lossless_evidence(machine, d)}"
                               for d, why in ranked[:rank])
            return DtypeChoice(dtype, "auto", f"the fastest dtype shown lossless on a {where}: {passed}")
    return DtypeChoice("float32", "auto", f"no dtype has been shown lossless on a {where}: float32, the reference "
                                          "(full float32 matmuls in every decode program; python -m jf_jax.doctor "
                                          "--check tests bf16 here)")


def header(machine: Machine, choice: DtypeChoice) -> str:
    """The decode CLI's engine lines: the path of the chosen dtype on this machine, and why auto chose it."""
    path = engine_path(machine, choice.dtype)
    features = machine.features()
    where = (f"{machine.cpu_model or 'CPU'} [{' '.join(f for f, on in features.items() if on)}]" if features is not None
             else f"{machine.cpu_model or 'CPU'} [features unknown]")
    lines = [f"engine: {path.summary} on {where if machine.backend == 'cpu' else ', '.join(machine.devices)}"]
    if choice.requested == "auto":
        lines.append(f"dtype auto -> {choice.dtype}: {choice.reason}")
    if path.note:
        lines.append(f"note: {path.note}")
    return "\n".join(lines)


def environment(machine: Machine, choice: DtypeChoice) -> dict:
    """The machine and the engine path of ``choice``, as plain data (the decode report's "environment")."""
    return {"jax": jax.__version__, "backend": machine.backend, "devices": list(machine.devices),
            "cpu_model": machine.cpu_model, "cpu_features": machine.features(),
            "avx512_kernels": "run" if machine.avx512_kernels_run else
            machine.avx512_machine_reason or machine.avx512_library_problem,
            "avx2_gemm": "run" if machine.avx2_gemm_runs else
            machine.avx2_machine_reason or machine.avx2_library_problem,
            "dtype": choice.dtype, "dtype_requested": choice.requested, "dtype_reason": choice.reason,
            "engine": engine_path(machine, choice.dtype).summary}
