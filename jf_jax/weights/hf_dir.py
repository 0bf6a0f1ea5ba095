"""Hugging Face model directories: config.json + (sharded) safetensors -> jf-jax params.

The safetensors numpy API cannot produce bfloat16 (numpy has no such dtype), so BF16 tensors are read
straight from the file: the format is an 8-byte header length, a JSON header of dtype/shape/byte offsets,
then raw little-endian data, which we view as ``jnp.bfloat16`` (ml_dtypes' numpy bfloat16). Tensors keep
the checkpoint's precision when it is uniformly bfloat16 and are widened to float32 otherwise, so nothing
is rounded.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import jax.numpy as jnp
import numpy as np

from jf_jax.model.config import ConfigError, ModelConfig, from_hf_config
from jf_jax.weights.hf_names import WeightsError, params_from_hf
from jf_jax.weights.tokenizer import Tokenizer

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"


def read_json(path: str, what: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise WeightsError(f"{path} is missing ({what})")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{path} is not valid JSON ({what}): {e}") from e
    if not isinstance(data, dict):
        raise WeightsError(f"{path} must hold a JSON object ({what})")
    return data


def weight_files(path: str) -> list[str]:
    """The safetensors files of a model directory, from the shard index when there is one."""
    index = os.path.join(path, _INDEX)
    if os.path.isfile(index):
        weight_map = read_json(index, "the safetensors shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
        if missing:
            raise WeightsError(f"{path}: shards listed in {_INDEX} are missing: {', '.join(missing)}")
        return [os.path.join(path, f) for f in files]
    if os.path.isfile(os.path.join(path, _SINGLE)):
        return [os.path.join(path, _SINGLE)]
    raise WeightsError(f"{path} has no weights: expected {_SINGLE} or {_INDEX} with its shards "
                       "(pytorch_model.bin checkpoints are not supported)")


def _read_bf16(file: str, names: list[str]) -> dict[str, np.ndarray]:
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name in names:
        start, end = header[name]["data_offsets"]
        shape = tuple(header[name]["shape"])
        out[name] = np.frombuffer(data[start:end], dtype=jnp.bfloat16).reshape(shape).copy()
    return out


def read_safetensors(file: str) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file as numpy arrays (BF16 as jnp.bfloat16)."""
    from safetensors import safe_open

    out, bf16 = {}, []
    try:
        with safe_open(file, framework="np") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":
                    bf16.append(name)
                else:
                    out[name] = f.get_tensor(name)
        out.update(_read_bf16(file, bf16))
    except Exception as e:  # safetensors raises SafetensorError (a bare Exception subclass) on corrupt files
        raise WeightsError(f"{file} is not a readable safetensors file: {type(e).__name__}: {e}") from e
    return out


def read_tensors(path: str) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for file in weight_files(path):
        for name, value in read_safetensors(file).items():
            if name in tensors:
                raise WeightsError(f"{path}: tensor {name} appears in more than one shard")
            tensors[name] = value
    return tensors


def storage_dtype(tensors: dict[str, np.ndarray]):
    """bfloat16 when every floating tensor is bfloat16 (keeps a bf16 checkpoint at half the size)."""
    dtypes = {v.dtype for v in tensors.values() if v.dtype.kind == "f" or v.dtype == jnp.bfloat16}
    return jnp.bfloat16 if dtypes == {np.dtype(jnp.bfloat16)} else np.float32


def load_hf_dir(path: str) -> tuple[ModelConfig, dict, Tokenizer]:
    """(config in the checkpoint's precision, numpy params, tokenizer) of a Hugging Face directory."""
    if not os.path.isdir(path):
        raise WeightsError(f"{path} is not a directory")
    hf = read_json(os.path.join(path, "config.json"), "the model's Hugging Face config")
    try:
        cfg = from_hf_config(hf)
    except ConfigError as e:
        raise ConfigError(f"{os.path.join(path, 'config.json')}: {e}") from e
    tensors = read_tensors(path)
    dtype = storage_dtype(tensors)
    dtype_name = "bfloat16" if dtype is jnp.bfloat16 else "float32"
    cfg = cfg.replace(dtype=dtype_name, param_dtype=dtype_name)
    params = params_from_hf(cfg, tensors, dtype=dtype, source=path)
    return cfg, params, Tokenizer.from_hf_dir(path)
