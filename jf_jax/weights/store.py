"""Cache of converted weights: orbax params + config JSON + tokenizer, keyed by the source files.

Dequantizing a GGUF or re-laying-out safetensors takes seconds to minutes; restoring the converted
pytree with orbax takes a fraction of that. An entry lives in ``<cache root>/<name>-<key>/`` where the
key hashes the source's absolute path, sizes and mtimes (and this module's format version), so editing
or replacing the source misses the cache instead of serving stale weights.

Entries are written to a temporary directory beside the final one and renamed into place only when
complete. A rename within one filesystem is atomic, so a crash mid-save leaves only a ``.tmp-*``
directory that is never read, never a half entry that would be trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid

import jax
import numpy as np

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, param_specs
from jf_jax.weights.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

CACHE_ENV = "JF_JAX_CACHE"
FORMAT_VERSION = 2  # bump when the conversion changes, so old entries are ignored
_FILES = ("config.json", "source.json", "tokenizer/tokenizer.json", "tokenizer/jf_jax_tokenizer.json")


def cache_root() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "jf_jax")


def _source_files(source: str) -> list[str]:
    if os.path.isfile(source):
        return [source]
    return sorted(os.path.join(source, f) for f in os.listdir(source)
                  if f.endswith((".json", ".safetensors", ".jinja", ".txt", ".model")))


def cache_key(source: str) -> str:
    """A hash of the source's absolute path and each file's name, size and mtime (nanoseconds)."""
    h = hashlib.sha256(f"jf_jax-weights-v{FORMAT_VERSION}\0{os.path.abspath(source)}".encode())
    for file in _source_files(source):
        st = os.stat(file)
        h.update(f"\0{os.path.basename(file)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def entry_dir(source: str, root: str | None = None) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(os.path.normpath(source)))[:64]
    return os.path.join(root or cache_root(), f"{name}-{cache_key(source)}")


def _checkpointer():
    """A checkpointer of this process alone: in a multi-process run (``jax.distributed``) every process reads the
    cache by itself, at its own time, so orbax's barriers between processes (its default) would wait forever for
    processes that took another path (one converting while another reads)."""
    import orbax.checkpoint as ocp

    me = jax.process_index()
    return ocp.StandardCheckpointer(
        multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me},
                                                                   barrier_sync_key_prefix=f"jf_jax_cache_{me}"))


def _abstract(cfg: ModelConfig) -> Params:
    """Restore target: shapes from the parameter declaration, placed on this process's first device."""
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    dtype = cfg.weight_dtype
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sharding), param_specs(cfg),
                        is_leaf=lambda x: hasattr(x, "axes"))


def save_entry(path: str, cfg: ModelConfig, params: Params, tokenizer: Tokenizer, source: str) -> None:
    """Writes an entry atomically (temp dir + rename); a concurrent writer that wins the race is kept."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    try:
        ckpt = _checkpointer()
        ckpt.save(os.path.join(tmp, "params"), jax.tree.map(np.asarray, params))
        ckpt.wait_until_finished()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=1)
        with open(os.path.join(tmp, "source.json"), "w") as f:
            json.dump({"source": os.path.abspath(source), "format_version": FORMAT_VERSION}, f)
        tokenizer.save(os.path.join(tmp, "tokenizer"))
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isdir(path):
                raise
            logger.info("cache entry %s was written concurrently; keeping that one", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_entry(path: str) -> tuple[ModelConfig, Params, Tokenizer] | None:
    """The cached (config, params, tokenizer), or None when there is no complete, readable entry."""
    if not os.path.isdir(path):
        return None
    if not all(os.path.isfile(os.path.join(path, f)) for f in _FILES):
        logger.warning("ignoring incomplete cache entry %s", path)
        return None
    try:
        with open(os.path.join(path, "config.json")) as f:
            cfg = ModelConfig.from_dict(json.load(f))
        params = _checkpointer().restore(os.path.join(path, "params"), _abstract(cfg))
        tokenizer = Tokenizer.load_saved(os.path.join(path, "tokenizer"))
    except Exception as e:  # noqa: BLE001 - any unreadable entry is re-converted, never trusted
        logger.warning("ignoring unreadable cache entry %s: %s: %s", path, type(e).__name__, e)
        return None
    return cfg, params, tokenizer


def discard_entry(path: str) -> None:
    """Moves a bad entry aside first (atomic), so no reader sees it half-deleted."""
    if os.path.isdir(path):
        doomed = os.path.join(os.path.dirname(path), f".tmp-discard-{uuid.uuid4().hex[:8]}")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def load_or_convert(source: str, convert, root: str | None = None):
    """``convert(source)`` -> (cfg, params, tokenizer), served from the cache when an entry exists.

    Returns ``(cfg, params, tokenizer, hit)``; params are jax arrays on a hit, numpy after a conversion.
    """
    path = entry_dir(source, root)
    cached = load_entry(path)
    if cached is not None:
        return (*cached, True)
    cfg, params, tokenizer = convert(source)
    if jax.process_index() != 0:  # in a multi-process run one writer: process 0's entry reads as a one-process one
        return cfg, params, tokenizer, False
    discard_entry(path)
    try:
        save_entry(path, cfg, params, tokenizer, source)
    except OSError as e:  # a read-only or full disk must not stop the model from loading
        logger.warning("could not write cache entry %s: %s", path, e)
    return cfg, params, tokenizer, False
