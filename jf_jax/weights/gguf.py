"""GGUF files (llama.cpp) -> Hugging Face config dict + HF-named float32 tensors -> jf-jax params.

A GGUF holds its hyperparameters as ``<arch>.*`` metadata and its tensors under llama.cpp names, possibly
quantized. We turn both into their Hugging Face form (config.json keys, ``model.layers.N...`` names, HF
shapes) so that the one strict name map in ``jf_jax.weights.hf_names`` does the rest. Two llama.cpp conventions
are undone here:

* GGUF lists dimensions fastest-first (``[in, out]``); the row-major array the reader returns is already
  in HF's ``[out, in]`` order, which we assert rather than assume.
* For ``llama`` files, llama.cpp's converter permutes the rows of Q and K (and their biases) so its RoPE
  can rotate adjacent pairs; HF rotates halves. We apply the inverse permutation. Qwen2 files are not
  permuted (llama.cpp uses the "NeoX" half rotation for them).

RoPE-scaling metadata (``<arch>.rope.scaling.*``) is read as llama.cpp's loader reads it, and every key is either
applied or refused by name (``rope_scaling_from_metadata``): none is dropped.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import numpy as np

from jf_jax.model.config import ConfigError, ModelConfig, from_hf_config
from jf_jax.weights.hf_names import WeightsError, params_from_hf
from jf_jax.weights.tokenizer import Tokenizer

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")

_LAYER_RENAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_RENAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, or None if it is not one we know."""
    if gguf_name in _TOP_RENAMES:
        return _TOP_RENAMES[gguf_name]
    m = _LAYER_NAME.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_RENAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_RENAMES[m.group(2)]}"
    return None


def open_gguf(path: str):
    """A ``gguf.GGUFReader`` over ``path``; corrupt or truncated files raise a WeightsError naming it."""
    import gguf

    if not os.path.isfile(path):
        raise WeightsError(f"GGUF file {path} does not exist")
    try:
        reader = gguf.GGUFReader(path)
    except ValueError as e:
        if "magic" in str(e).lower():
            raise WeightsError(f"{path} is not a GGUF file (bad magic bytes; expected 'GGUF')") from e
        raise WeightsError(f"{path} is truncated or corrupt (the GGUF reader failed: {e})") from e
    except (IndexError, OSError, UnicodeDecodeError, KeyError, OverflowError, MemoryError) as e:
        raise WeightsError(f"{path} is truncated or corrupt (the GGUF reader failed: "
                           f"{type(e).__name__}: {e})") from e
    # The reader maps tensor data lazily; a file cut inside the data section must be caught here.
    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise WeightsError(f"{path} is truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes}"
                               f" but the file has {size} bytes")
    return reader


def read_metadata(reader, source: str) -> dict[str, Any]:
    """Every key/value of the file as plain Python values (strings, numbers, lists)."""
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # header pseudo-fields (version, counts)
            continue
        try:
            meta[key] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise WeightsError(f"{source}: metadata field {key} is corrupt: {e}") from e
    return meta


# llama.cpp's rope-scaling keys (gguf.constants.Keys.Rope.SCALING_*, "<arch>.rope.scaling.<name>") and what each
# becomes here. Applied, as llama.cpp's common loader reads them for every architecture: ``type`` (llama.cpp's
# default when absent is "linear"), ``factor`` (falling back to the legacy ``<arch>.rope.scale_linear``; absent or 0
# means 1) and ``original_context_length`` (YaRN's pretraining context; default the file's context_length).
# ``yarn_beta_fast`` / ``yarn_beta_slow`` are applied for type yarn: llama.cpp's converter writes them from the HF
# config's beta_fast / beta_slow, which jf_jax.model.rope applies as transformers does. (llama.cpp's runtime reads
# them only for a few architectures, not llama / qwen2 / qwen3, where it always uses 32 / 1: for a file with other
# values llama.cpp departs from the model it was converted from; we follow the model.) ``finetuned`` is a flag
# llama.cpp only prints: it changes nothing, so any value is accepted and ignored.
_ROPE_HANDLED = ("type", "factor", "original_context_length", "finetuned")
_ROPE_YARN_APPLIED = ("yarn_beta_fast", "yarn_beta_slow")
_GGUF_ROPE_TYPES = ("none", "linear", "yarn")  # llama.cpp's other type, longrope, is not supported


def _rope_neutral_values(kind: str) -> dict[str, tuple[float, ...]]:
    """The rope.scaling keys we do not apply, each with the values at which llama.cpp's RoPE is unchanged by it.

    Such a key is accepted silently at one of these values and refused at any other: they are llama.cpp's own
    defaults (its ``llama_model_saver`` writes attn_factor 1 and yarn_log_multiplier 0 into every file it saves, so
    refusing them would refuse plain models), and for ``alpha`` the identity. ``attn_factor`` multiplies cos and sin;
    ``yarn_log_multiplier`` rescales YaRN's attention factor (DeepSeek's mscale_all_dim); ``alpha`` is NTK-alpha
    scaling (Hunyuan; base * alpha^(d/(d-2))); ``yarn_ext_factor`` is YaRN's ramp mix (-1 = automatic: 1 for yarn,
    0 otherwise). The yarn-only keys are inert for the other types at their defaults. ``yarn_attn_factor`` has no
    neutral value for type yarn: llama.cpp's converter writes HF's attention_factor there (so 1.0 would mean "no
    scaling"), while llama.cpp's runtime multiplies the derived factor by it or, in newer versions, overrides it;
    we refuse it.
    """
    yarn = kind == "yarn"
    return {
        "attn_factor": (1.0,),
        "alpha": (1.0,),
        "yarn_log_multiplier": (0.0,),
        "yarn_ext_factor": (-1.0, 1.0) if yarn else (-1.0, 0.0),
        "yarn_attn_factor": () if yarn else (1.0,),
        **({} if yarn else {"yarn_beta_fast": (32.0,), "yarn_beta_slow": (1.0,)}),
    }


def rope_scaling_from_metadata(meta: Mapping[str, Any], arch: str, source: str) -> dict[str, Any] | None:
    """The HF ``rope_scaling`` dict of a GGUF's ``<arch>.rope.scaling.*`` metadata (None for plain RoPE).

    Every key is applied or refused: a ConfigError names each key (with its value) that jf-jax does not apply
    and the file, before any tensor is converted.
    """
    prefix = f"{arch}.rope.scaling."
    kind = meta.get(prefix + "type", "linear")
    if kind not in _GGUF_ROPE_TYPES:
        raise ConfigError(f"{source}: {prefix}type {kind!r} is not supported; supported: "
                          f"{', '.join(_GGUF_ROPE_TYPES)}")
    neutral = _rope_neutral_values(kind)
    handled = _ROPE_HANDLED + (_ROPE_YARN_APPLIED if kind == "yarn" else ())
    refused = []
    for key in sorted(k for k in meta if k.startswith(prefix)):
        name, value = key[len(prefix):], meta[key]
        if name in handled:
            continue
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in neutral and is_number and float(value) in neutral[name]:
            continue
        refused.append(f"{key}={value!r}")
    if refused:
        raise ConfigError(f"{source}: RoPE scaling metadata jf-jax does not apply: {', '.join(refused)} "
                          f"({prefix}type {kind!r}); refusing the file rather than ignoring it")

    factor = meta.get(prefix + "factor")
    if factor is None:
        factor = meta.get(f"{arch}.rope.scale_linear")
    factor = 1.0 if factor is None or float(factor) == 0.0 else float(factor)
    if kind == "none" or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    yarn = {"rope_type": "yarn", "factor": factor}
    original = meta.get(prefix + "original_context_length", meta.get(f"{arch}.context_length"))
    if original is not None:
        yarn["original_max_position_embeddings"] = int(original)
    for name in _ROPE_YARN_APPLIED:
        if meta.get(prefix + name) is not None:
            yarn[name.removeprefix("yarn_")] = float(meta[prefix + name])
    return yarn


def hf_config_from_metadata(meta: Mapping[str, Any], tensor_names, source: str) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict a GGUF's ``<arch>.*`` metadata describes."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ConfigError(f"{source}: unsupported general.architecture {arch!r}; "
                          f"supported: {', '.join(GGUF_ARCHITECTURES)}")

    def get(key, default=None, required=False):
        value = meta.get(f"{arch}.{key}", default)
        if value is None and required:
            raise ConfigError(f"{source}: GGUF metadata lacks {arch}.{key}")
        return value

    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if isinstance(get(key), list):  # llama.cpp allows per-layer values; our layers are uniform
            raise ConfigError(f"{source}: per-layer values of {arch}.{key} are not supported")
    hidden = int(get("embedding_length", required=True))
    heads = int(get("attention.head_count", required=True))
    head_dim = int(get("attention.key_length", hidden // heads))
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ConfigError(f"{source}: partial rotary embeddings ({arch}.rope.dimension_count={rope_dims}, "
                          f"head_dim={head_dim}) are not supported")
    vocab = get("vocab_size")
    if vocab is None:
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ConfigError(f"{source}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
        vocab = len(tokens)
    hf = {
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length", required=True)),
        "num_hidden_layers": int(get("block_count", required=True)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(get("context_length", 32768)),
        # llama.cpp's converter writes no output.weight when the LM head is the embedding.
        "tie_word_embeddings": "output.weight" not in set(tensor_names),
        "hidden_act": "silu",
    }
    scaling = rope_scaling_from_metadata(meta, arch, source)
    if scaling is not None:
        hf["rope_scaling"] = scaling
    if "rope_freqs.weight" in set(tensor_names):
        raise ConfigError(f"{source}: per-frequency RoPE factors (rope_freqs.weight, llama.cpp's form of Llama 3.1 "
                          "rope scaling) are not supported in GGUF files; load the Hugging Face directory instead")
    if arch == "llama":
        hf["attention_bias"] = "blk.0.attn_q.bias" in set(tensor_names)
    return hf


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute``: rows per head go from interleaved pairs back to two halves.

    llama.cpp writes ``w.reshape(n_heads, 2, rows // n_heads // 2, *rest).swapaxes(1, 2)``; swapping the
    same two axes of the transposed grouping restores HF's order. Works for weights and 1-D biases.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise WeightsError(f"cannot undo the Q/K permutation: {rows} rows are not 2 x {n_heads} heads")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader, hf: Mapping[str, Any], source: str) -> dict[str, np.ndarray]:
    """Every tensor of the file dequantized to float32, renamed and reshaped into Hugging Face form."""
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    unknown = []
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            unknown.append(t.name)
            continue
        try:
            w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except (NotImplementedError, ValueError, KeyError) as e:
            raise WeightsError(f"{source}: cannot dequantize tensor {t.name} "
                               f"({getattr(t.tensor_type, 'name', t.tensor_type)}): {e}") from e
        expected = tuple(int(d) for d in reversed(t.shape))  # GGUF dims are listed fastest-first
        if w.shape != expected:
            raise WeightsError(f"{source}: tensor {t.name} dequantized to shape {w.shape}, expected {expected}")
        if hf["model_type"] == "llama" and (".attn_q." in t.name or ".attn_k." in t.name):
            heads = hf["num_attention_heads"] if ".attn_q." in t.name else hf["num_key_value_heads"]
            w = unpermute_qk(w, heads)
        out[name] = w
    if unknown:
        raise WeightsError(f"{source}: unsupported GGUF tensors {', '.join(sorted(unknown)[:8])}"
                           + (f" (and {len(unknown) - 8} more)" if len(unknown) > 8 else ""))
    return out


def load_gguf(path: str) -> tuple[ModelConfig, dict, Tokenizer]:
    """(float32 config, float32 numpy params, tokenizer) of a GGUF file; every failure names the file."""
    reader = open_gguf(path)
    meta = read_metadata(reader, path)
    names = [t.name for t in reader.tensors]
    hf = hf_config_from_metadata(meta, names, path)
    try:
        cfg = from_hf_config(hf)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    tensors = hf_tensors(reader, hf, path)
    params = params_from_hf(cfg, tensors, dtype=np.float32, source=path)
    return cfg, params, Tokenizer.from_gguf_metadata(meta, source=path)
