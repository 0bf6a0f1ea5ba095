"""Whether a command's outputs can be written, asked before any work: a bad output path fails at once, with the
reason, instead of as a traceback after hours of decoding, collection or training. Every command that writes
files (decode's JSON report, collect, train, evaluate) asks here."""

from __future__ import annotations

import os
import tempfile


def directory_problem(directory: str) -> str | None:
    """Why files could not be written in ``directory``, or None when they can. Creates the directory (and its
    parents) when it is missing, as the command would, then creates and removes a temporary file in it."""
    path = os.path.abspath(directory)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is not a directory"
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".jf_jax_write_check_", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        return f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
    return None


def file_problem(path: str) -> str | None:
    """Why the file ``path`` could not be written, or None when it can (its directory is created; the file is
    not)."""
    path = os.path.abspath(path)
    problem = directory_problem(os.path.dirname(path))
    if problem:
        return problem
    if os.path.isdir(path):
        return f"{path} is a directory"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    return None
