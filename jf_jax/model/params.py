"""The parameter pytree, declared once.

Every parameter is declared in ``param_specs`` with its shape, logical axes and initializer; the abstract
tree (for ``jax.eval_shape`` and checkpoint restore), random init, shardings and the converters' shape checks
all derive from that one declaration. Layers are stacked on a leading ``layers`` axis and run with
``lax.scan``; training and decoding share this one layout.

Layout (L layers, D hidden, H query heads, K kv heads, Dh head dim, F mlp width, V vocab)::

    embed        [V, D]
    layers/attn_norm [L, D]      layers/mlp_norm [L, D]
    layers/wq    [L, D, H, Dh]   layers/bq [L, H, Dh]   (biases only when cfg.attention_bias)
    layers/wk    [L, D, K, Dh]   layers/bk [L, K, Dh]
    layers/wv    [L, D, K, Dh]   layers/bv [L, K, Dh]
    layers/q_norm [L, Dh]        layers/k_norm [L, Dh]  (only when cfg.qk_norm: Qwen3)
    layers/wo    [L, H, Dh, D]
    layers/w_gate [L, D, F]      layers/w_up [L, D, F]   layers/w_down [L, F, D]
    final_norm   [D]
    lm_head      [D, V]          (absent when cfg.tie_word_embeddings: the embedding is reused)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.model.config import ModelConfig

Params = dict  # nested dict of arrays, keyed as in the layout above


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter: its shape, logical axis names and how to initialise it."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: str  # "normal" (scaled by fan-in), "zeros" or "ones"
    fan_in: int = 1

    def __post_init__(self):
        if len(self.shape) != len(self.axes):
            raise ValueError(f"shape {self.shape} and axes {self.axes} disagree in rank")


def param_specs(cfg: ModelConfig) -> dict:
    """The single declaration of every parameter of ``cfg``'s model."""
    L, D, H, K, Dh = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    F, V = cfg.intermediate_size, cfg.vocab_size
    layers = {
        "attn_norm": ParamSpec((L, D), ("layers", "embed"), "ones"),
        "wq": ParamSpec((L, D, H, Dh), ("layers", "embed", "q_heads", "head_dim"), "normal", D),
        "wk": ParamSpec((L, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim"), "normal", D),
        "wv": ParamSpec((L, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim"), "normal", D),
        "wo": ParamSpec((L, H, Dh, D), ("layers", "q_heads", "head_dim", "embed"), "normal", H * Dh),
        "mlp_norm": ParamSpec((L, D), ("layers", "embed"), "ones"),
        "w_gate": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal", D),
        "w_up": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal", D),
        "w_down": ParamSpec((L, F, D), ("layers", "mlp", "embed"), "normal", F),
    }
    if cfg.qk_norm:
        layers["q_norm"] = ParamSpec((L, Dh), ("layers", "head_dim"), "ones")
        layers["k_norm"] = ParamSpec((L, Dh), ("layers", "head_dim"), "ones")
    if cfg.attention_bias:
        # Initialised small but non-zero so parity tests exercise the bias path.
        layers["bq"] = ParamSpec((L, H, Dh), ("layers", "q_heads", "head_dim"), "normal", D)
        layers["bk"] = ParamSpec((L, K, Dh), ("layers", "kv_heads", "head_dim"), "normal", D)
        layers["bv"] = ParamSpec((L, K, Dh), ("layers", "kv_heads", "head_dim"), "normal", D)
    specs = {
        "embed": ParamSpec((V, D), ("vocab", "embed"), "normal", D),
        "layers": layers,
        "final_norm": ParamSpec((D,), ("embed",), "ones"),
    }
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((D, V), ("embed", "vocab"), "normal", D)
    return specs


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def abstract_params(cfg: ModelConfig) -> Params:
    """ShapeDtypeStructs of every parameter, without allocating anything."""
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, cfg.weight_dtype), param_specs(cfg), is_leaf=_is_spec)


def logical_axes(cfg: ModelConfig) -> dict:
    """The logical axis names of every parameter (mapped to mesh axes by sharding rules)."""
    return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=_is_spec)


def _init_one(spec: ParamSpec, key, dtype) -> jax.Array:
    if spec.init == "ones":
        return jnp.ones(spec.shape, dtype)
    if spec.init == "zeros":
        return jnp.zeros(spec.shape, dtype)
    std = 1.0 / math.sqrt(spec.fan_in)
    return (std * jax.random.normal(key, spec.shape, jnp.float32)).astype(dtype)


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """Random parameters (for tests, synthetic models and training from scratch)."""
    specs = param_specs(cfg)
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [_init_one(s, k, cfg.weight_dtype) for s, k in zip(leaves, keys)])


def count_params(tree) -> int:
    """Number of scalars in a (possibly abstract) parameter tree."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


def param_bytes(tree) -> int:
    return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def check_params(cfg: ModelConfig, params: Params, source: str = "parameters") -> None:
    """Raises a ValueError naming each missing, unexpected or mis-shaped tensor of ``params``."""
    expected = {jax.tree_util.keystr(p): s for p, s in
                jax.tree_util.tree_flatten_with_path(param_specs(cfg), is_leaf=_is_spec)[0]}
    got = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    problems = [f"missing tensor {k}" for k in expected if k not in got]
    problems += [f"unexpected tensor {k}" for k in got if k not in expected]
    problems += [f"tensor {k} has shape {tuple(got[k].shape)}, expected {expected[k].shape}"
                 for k in expected if k in got and tuple(got[k].shape) != expected[k].shape]
    if problems:
        raise ValueError(f"{source} do not match the model config: " + "; ".join(problems))


def cast_params(params: Params, dtype) -> Params:
    return jax.tree.map(lambda x: x.astype(dtype), params)
