"""Hugging Face tensor names <-> the jf-jax parameter pytree, strictly.

Every HF tensor is matched by exactly one rule; its shape is checked against the HF shape implied by the
config before it is transposed into our layout; per-layer tensors are stacked on the leading layer axis.
A missing, unexpected, duplicated or mis-shaped tensor raises an error naming it. GGUF files are first
renamed into HF names (``jf_jax.weights.gguf``) and then go through this same map.
"""

from __future__ import annotations

import re
from typing import Mapping

import jax.numpy as jnp
import numpy as np

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, check_params


class WeightsError(ValueError):
    """Weights are missing, corrupt, or do not match the model configuration."""


# Tensors some checkpoints carry that hold no parameters (recomputed from the config).
_IGNORED = (re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),)


def _rules(cfg: ModelConfig):
    """(regex, param key, hf shape, to_ours, to_hf) per HF tensor kind."""
    D, H, K, Dh, F, V = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.vocab_size)
    ident = lambda w: w  # noqa: E731
    t = lambda w: w.T  # noqa: E731

    def proj_in(heads):  # (to ours, to HF) of a q/k/v projection with ``heads`` heads
        return (lambda w: w.T.reshape(D, heads, Dh)), (lambda w: w.reshape(D, heads * Dh).T)

    q_in, k_in = proj_in(H), proj_in(K)
    layer = r"model\.layers\.(\d+)\."
    rules = [
        (r"model\.embed_tokens\.weight", "embed", (V, D), ident, ident),
        (r"model\.norm\.weight", "final_norm", (D,), ident, ident),
        (layer + r"input_layernorm\.weight", "attn_norm", (D,), ident, ident),
        (layer + r"post_attention_layernorm\.weight", "mlp_norm", (D,), ident, ident),
        (layer + r"self_attn\.q_proj\.weight", "wq", (H * Dh, D), *q_in),
        (layer + r"self_attn\.k_proj\.weight", "wk", (K * Dh, D), *k_in),
        (layer + r"self_attn\.v_proj\.weight", "wv", (K * Dh, D), *k_in),
        (layer + r"self_attn\.o_proj\.weight", "wo", (D, H * Dh),
         lambda w: w.T.reshape(H, Dh, D), lambda w: w.reshape(H * Dh, D).T),
        (layer + r"mlp\.gate_proj\.weight", "w_gate", (F, D), t, t),
        (layer + r"mlp\.up_proj\.weight", "w_up", (F, D), t, t),
        (layer + r"mlp\.down_proj\.weight", "w_down", (D, F), t, t),
    ]
    if cfg.qk_norm:
        rules += [(layer + r"self_attn\.q_norm\.weight", "q_norm", (Dh,), ident, ident),
                  (layer + r"self_attn\.k_norm\.weight", "k_norm", (Dh,), ident, ident)]
    if cfg.attention_bias:
        rules += [
            (layer + r"self_attn\.q_proj\.bias", "bq", (H * Dh,), lambda b: b.reshape(H, Dh), lambda b: b.reshape(-1)),
            (layer + r"self_attn\.k_proj\.bias", "bk", (K * Dh,), lambda b: b.reshape(K, Dh), lambda b: b.reshape(-1)),
            (layer + r"self_attn\.v_proj\.bias", "bv", (K * Dh,), lambda b: b.reshape(K, Dh), lambda b: b.reshape(-1)),
        ]
    if not cfg.tie_word_embeddings:
        rules.append((r"lm_head\.weight", "lm_head", (V, D), t, t))
    return [(re.compile(p), key, shape, to_ours, to_hf) for p, key, shape, to_ours, to_hf in rules]


def params_from_hf(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], dtype=None,
                   source: str = "checkpoint") -> Params:
    """Converts HF-named tensors (numpy arrays) into the stacked parameter pytree (numpy, ``dtype``)."""
    dtype = jnp.dtype(dtype or cfg.param_dtype)  # a numpy dtype; bfloat16 comes from ml_dtypes
    rules = _rules(cfg)
    top: dict[str, np.ndarray] = {}
    per_layer: dict[str, dict[int, np.ndarray]] = {}
    problems = []
    for name, value in tensors.items():
        if any(p.fullmatch(name) for p in _IGNORED):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            embed = tensors.get("model.embed_tokens.weight")
            if embed is None or embed.shape != value.shape or not np.array_equal(embed, value):
                problems.append("lm_head.weight differs from model.embed_tokens.weight but the config ties them")
            continue
        match = next(((m, rule) for rule in rules if (m := rule[0].fullmatch(name))), None)
        if match is None:
            problems.append(f"unexpected tensor {name}")
            continue
        m, (_, key, hf_shape, to_ours, _) = match
        if tuple(value.shape) != hf_shape:
            problems.append(f"tensor {name} has shape {tuple(value.shape)}, expected {hf_shape}")
            continue
        converted = to_ours(np.asarray(value))
        if m.groups():
            index = int(m.group(1))
            if index >= cfg.num_layers:
                problems.append(f"unexpected tensor {name} (the config has {cfg.num_layers} layers)")
                continue
            per_layer.setdefault(key, {})[index] = converted
        else:
            top[key] = converted
    for _, key, _, _, _ in rules:
        if key in per_layer or key in top:
            continue
        problems.append(f"missing tensor for {key}")
    for key, layers in per_layer.items():
        missing = sorted(set(range(cfg.num_layers)) - set(layers))
        if missing:
            problems.append(f"missing layers {missing} of {key}")
    if problems:
        raise WeightsError(f"{source} does not match the {cfg.architecture} config: " + "; ".join(problems))
    cast = lambda a: a.astype(dtype)  # noqa: E731
    params = {k: cast(v) for k, v in top.items() if k != "lm_head"}
    params["layers"] = {k: cast(np.stack([v[i] for i in range(cfg.num_layers)])) for k, v in per_layer.items()}
    if "lm_head" in top:
        params["lm_head"] = cast(top["lm_head"])
    check_params(cfg, params, source)
    return params


def params_to_hf(cfg: ModelConfig, params: Params) -> dict[str, np.ndarray]:
    """The inverse of ``params_from_hf``: HF-named float32 numpy tensors."""
    out = {}
    for pattern, key, _, _, to_hf in _rules(cfg):
        name = pattern.pattern.replace("\\.", ".")
        if key in ("embed", "final_norm", "lm_head"):
            out[name] = np.asarray(to_hf(np.asarray(params[key], np.float32)))
            continue
        stacked = np.asarray(params["layers"][key], np.float32)
        for i in range(cfg.num_layers):
            out[name.replace("(\\d+)", str(i))] = np.ascontiguousarray(to_hf(stacked[i]))
    return out
