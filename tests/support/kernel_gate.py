"""Whether a test of jf-jax's CPU kernels runs, skips or fails on this machine.

A machine that cannot run a kernel set (not a CPU backend, or a CPU without the set's instructions: AVX512-BF16 /
AVX512-VNNI for ``library.AVX512``, AVX2 / FMA for ``library.AVX2``) skips its tests: nothing there could make
them run. A machine that can run them must: a missing, stale or unloadable library there is an install fault
(``python -m cpu_kernels.build``), and the kernel tests fail on it rather than turn into silent skips (which is
how a broken build would otherwise pass CI).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Verdict:
    action: str
    """"run", "skip" or "fail"."""
    reason: str | None = None


def verdict(machine_reason: str | None, library_problem: str | None) -> Verdict:
    """From ``cpu_kernels.library.machine_reason`` (the backend and CPU features alone) and
    ``library.library_problem`` (the compiled library), the fate of a kernel test."""
    if machine_reason is not None:
        return Verdict("skip", f"the CPU kernels cannot run on this machine: {machine_reason}")
    if library_problem is not None:
        return Verdict("fail", f"this CPU can run the CPU kernels, but {library_problem}: that is a failure, not a "
                               "skip (scripts/install.sh builds them)")
    return Verdict("run")


def this_machine(kernel_set_name: str = "avx512") -> Verdict:
    from cpu_kernels import library

    return verdict(*library.this_process({s.name: s for s in library.KERNEL_SETS}[kernel_set_name]))


def apply(v: Verdict) -> None:
    """Skips or fails the calling test as ``v`` says (returns when it runs)."""
    import pytest

    if v.action == "skip":
        pytest.skip(v.reason)
    if v.action == "fail":
        pytest.fail(v.reason, pytrace=False)


def use_only(monkeypatch, *names: str) -> None:
    """Lets this test use only the kernel sets ``names`` (of those that run here): ``use_only(mp)`` gives the
    plain-JAX twins everywhere, ``use_only(mp, "avx2")`` the engine of an AVX2-only CPU. Programs traced after the
    call see it; programs compiled before it keep what they were built with."""
    from cpu_kernels import library

    available = library.available
    monkeypatch.setattr(library, "available", lambda kernel_set=library.AVX512: kernel_set.name in names
                        and available(kernel_set))
