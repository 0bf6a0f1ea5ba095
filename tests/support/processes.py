"""Two localhost processes of one ``jax.distributed`` run, for the multi-process tests: a free port for the
coordinator, both processes started, waited for within a bound, and killed even when the test fails."""

from __future__ import annotations

import socket
import subprocess
from typing import Callable, Sequence

COORDINATED = ("--num-processes", "2", "--cpu-collectives", "gloo")
"""What a ``jf-jax`` command of the pair takes beside ``--coordinator`` and ``--process-id``."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_pair(command: Callable[[int, int], Sequence[str]], *, cwd: str, env: dict,
             timeout: float) -> list[tuple[int, str, str]]:
    """``command(port, process_id)`` for process ids 0 and 1, run side by side; (returncode, stdout, stderr) of
    each. Both are killed when the wait ends, however it ends."""
    port = free_port()
    procs = [subprocess.Popen(list(command(port, i)), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]


def jf_jax_pair(command: Sequence[str]) -> Callable[[int, int], list[str]]:
    """The per-process command line of a ``jf-jax`` command joining a 2-process run on localhost."""
    return lambda port, i: [*command, "--coordinator", f"localhost:{port}", "--process-id", str(i), *COORDINATED]
