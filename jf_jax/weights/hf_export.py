"""Writing a model as a Hugging Face directory that transformers loads without jf-jax.

::

    OUT/config.json              LlamaConfig / Qwen2Config fields of the ModelConfig (``hf_config``)
    OUT/generation_config.json   bos / eos / pad ids (transformers' ``generate`` stops on every eos id)
    OUT/model.safetensors        float32 tensors under HF names (``hf_names.params_to_hf``, the inverse of the
                                 strict map every loader uses; tied embeddings write no lm_head)
    OUT/tokenizer.json           the tokenizer's ``tokenizers`` backend
    OUT/tokenizer_config.json    PreTrainedTokenizerFast with the special tokens and the chat template

Weights are written in float32 whatever the model's dtype: a bfloat16 model widens exactly, and numpy (which the
safetensors writer takes) has no bfloat16. ``jf_jax.weights.load(OUT)`` reads the directory back bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

import numpy as np

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, check_params
from jf_jax.weights.hf_names import WeightsError, params_to_hf
from jf_jax.weights.tokenizer import Tokenizer

_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def hf_config(cfg: ModelConfig, tokenizer: Tokenizer | None = None) -> dict:
    """The ``config.json`` of ``cfg``: ``jf_jax.model.config.from_hf_config`` of it gives ``cfg`` back (up to dtype)."""
    out = {
        "architectures": [_HF_CLASSES[cfg.architecture]],
        "model_type": cfg.architecture,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "float32",
    }
    if cfg.rope_scaling is not None:
        scaling = {k: v for k, v in dataclasses.asdict(cfg.rope_scaling).items() if v is not None}
        out["rope_scaling"] = scaling
    if cfg.architecture in ("llama", "qwen3"):
        out.update(attention_bias=cfg.attention_bias, mlp_bias=False)
    elif not cfg.attention_bias:  # Qwen2 always has q/k/v biases (from_hf_config assumes so)
        raise WeightsError("a qwen2 model without attention biases has no Hugging Face Qwen2 equivalent")
    if tokenizer is not None:
        out.update(_special_ids(tokenizer))
    return out


def _special_ids(tokenizer: Tokenizer) -> dict:
    eos = list(tokenizer.eos_ids)
    return {"bos_token_id": tokenizer.bos_id, "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": tokenizer.pad_id}


def _tokenizer_config(tokenizer: Tokenizer) -> dict:
    name = lambda i: None if i is None else tokenizer.id_to_token(i)  # noqa: E731
    added = {}
    for token_id in sorted({tokenizer.bos_id, tokenizer.pad_id, *tokenizer.eos_ids} - {None}):
        added[str(token_id)] = {"content": name(token_id), "lstrip": False, "rstrip": False, "normalized": False,
                                "single_word": False, "special": True}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(tokenizer.bos_id),
        "eos_token": name(tokenizer.eos_ids[0]) if tokenizer.eos_ids else None,
        "pad_token": name(tokenizer.pad_id),
        "add_bos_token": tokenizer.add_bos,
        "chat_template": tokenizer.chat_template,
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def check_destination(out_dir: str, overwrite: bool) -> str:
    """The absolute ``out_dir`` if an export may be written there (checked before any slow loading)."""
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir):
        if not overwrite:
            raise WeightsError(f"{out_dir} already exists (pass overwrite=True / --overwrite to replace it)")
        if not os.path.isdir(out_dir) or not set(os.listdir(out_dir)) <= set(FILES):
            raise WeightsError(f"{out_dir} holds files other than a Hugging Face export; refusing to replace it")
    return out_dir


def export_hf(cfg: ModelConfig, params: Params, tokenizer: Tokenizer, out_dir: str, *,
              overwrite: bool = False) -> str:
    """Writes ``params`` as a Hugging Face directory ``out_dir`` (see the module docstring); returns its path.

    The files are written into a temporary sibling directory and moved into place at the end, so an interrupted
    export never leaves a half-written model that looks complete. An existing ``out_dir`` is refused unless
    ``overwrite`` (and then only if it is empty or holds an earlier export)."""
    from safetensors.numpy import save_file

    out_dir = check_destination(out_dir, overwrite)
    check_params(cfg, params, source="the parameters to export")
    config = hf_config(cfg, tokenizer)
    tensors = {k: np.ascontiguousarray(v) for k, v in params_to_hf(cfg, params).items()}
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        _write_json(os.path.join(staging, "config.json"), config)
        _write_json(os.path.join(staging, "generation_config.json"), _special_ids(tokenizer))
        save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        tokenizer.backend.save(os.path.join(staging, "tokenizer.json"))
        _write_json(os.path.join(staging, "tokenizer_config.json"), _tokenizer_config(tokenizer))
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
