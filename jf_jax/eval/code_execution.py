"""HumanEval pass@1 by execution: a model's completion run against the problem's own tests, one sandboxed
subprocess per sample.

The program is the problem's prompt (its imports, helpers and the function's signature and docstring, a valid
function on its own), then the completion (a fenced code block that redefines the function, as the prompt's
instruction asks, or else a continuation of the body), then the problem's ``check`` function called on its entry
point. It runs in a fresh interpreter (``python -I``: no user site, no PYTHON* variables) in a temporary
directory that is deleted afterwards, with a wall-clock timeout, CPU / memory / file-size limits, an empty
environment, and a guard installed before the program runs that makes sockets, subprocesses, signals to other
processes and file writes or deletions outside the temporary directory raise ``PermissionError``. This is a
guard against accidents of a 135M model's code, not a security boundary against hostile code.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)
"""A fenced code block of an answer (untagged or tagged Python); its text is group 1."""
TIMEOUT_SECONDS = 10.0
MEMORY_BYTES = 2 << 30
FILE_BYTES = 16 << 20

# Installed in the child before the program: what a completion must not do.
GUARD = r'''
import builtins, os, shutil, socket, subprocess
_root = os.path.realpath(os.getcwd())
def _blocked(*args, **kwargs):
    raise PermissionError("not allowed in the HumanEval sandbox")
def _inside(path):
    try:
        full = os.path.realpath(os.fspath(path))
    except TypeError:
        return False
    return full == _root or full.startswith(_root + os.sep)
_open = builtins.open
def _guarded_open(file, mode="r", *args, **kwargs):
    if isinstance(file, int) or (any(c in mode for c in "wax+") and not _inside(file)):
        raise PermissionError(f"writing {file!r} is not allowed in the HumanEval sandbox")
    return _open(file, mode, *args, **kwargs)
builtins.open = _guarded_open
socket.socket = socket.create_connection = socket.socketpair = _blocked
subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_output = _blocked
for _name in ("system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execvp", "spawnv",
              "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "chmod", "chown",
              "truncate", "putenv", "chdir"):
    if hasattr(os, _name):
        setattr(os, _name, _blocked)
shutil.rmtree = shutil.move = shutil.copy = shutil.copyfile = _blocked
del _name
'''


@dataclasses.dataclass(frozen=True)
class ExecutionResult:
    passed: bool
    status: str
    """"passed", "failed" (an exception, e.g. a failed assertion), "timeout" or "no_code"."""
    detail: str = ""
    """The last lines of the child's stderr (why it failed)."""


def completion_code(text: str) -> str:
    """The code of a model's answer: its fenced Python blocks joined, or the whole text if it has none."""
    blocks = FENCE.findall(text)
    return "\n\n".join(b.strip("\n") for b in blocks) if blocks else text


def build_program(problem: dict, completion: str) -> str:
    """Prompt, completion and the problem's tests calling ``check(entry_point)``."""
    code = completion_code(completion)
    prompt = problem["prompt"]
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        body = f"{prompt}\n\n{code}\n"  # the completion redefines the function (what the instruction asks)
    else:
        body = f"{prompt}{code}\n"  # a continuation of the function's body
    return f"{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def run_program(program: str, timeout: float = TIMEOUT_SECONDS) -> ExecutionResult:
    """Runs ``program`` in the sandbox (see the module docstring); passed iff it exits 0 within ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="jf_humaneval_") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(program)
        cpu = int(timeout) + 1
        limits = (f"import resource\nresource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))\n"
                  f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_BYTES}, {MEMORY_BYTES}))\n"
                  f"resource.setrlimit(resource.RLIMIT_FSIZE, ({FILE_BYTES}, {FILE_BYTES}))\n")
        runner = (f"{limits}{GUARD}\n"
                  f"exec(compile(open({path!r}).read(), 'program.py', 'exec'), {{'__name__': '__main__'}})\n")
        try:  # its own session (process group), so a timeout kills whatever it started
            proc = subprocess.run([sys.executable, "-I", "-c", runner], cwd=tmp, env={"PATH": "/usr/bin:/bin"},
                                  capture_output=True, text=True, timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return ExecutionResult(False, "timeout", f"no result within {timeout:g} s")
    if proc.returncode == 0:
        return ExecutionResult(True, "passed")
    return ExecutionResult(False, "failed", "\n".join(proc.stderr.strip().splitlines()[-3:]))


def check_completion(problem: dict, completion: str, timeout: float = TIMEOUT_SECONDS) -> ExecutionResult:
    """Whether ``completion`` passes ``problem``'s tests (a HumanEval problem dict)."""
    if not completion_code(completion).strip():
        return ExecutionResult(False, "no_code")
    return run_program(build_program(problem, completion), timeout)


def pass_at_1(results: list[ExecutionResult]) -> float:
    """Greedy pass@1: the fraction of problems whose one completion passed."""
    return sum(r.passed for r in results) / len(results) if results else 0.0
