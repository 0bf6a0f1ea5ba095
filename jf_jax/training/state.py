"""Training state (step, params, optimizer state) and the optax optimizer.

Optimizer: global-norm clipping -> AdamW with a linear-warmup + cosine-decay learning rate. Weight decay
applies only to matrices (parameters with two or more non-``layers`` logical axes), not to norms or biases.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, logical_axes
from jf_jax.model.sharding import ShardingRules, param_shardings, replicated


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    learning_rate: float = 1e-5
    """Peak learning rate."""
    warmup_steps: int = 0
    end_lr_ratio: float = 0.0
    """Final learning rate of the cosine decay, as a fraction of the peak."""
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    grad_accum: int = 1
    """Micro-batches per step; the batch size must be divisible by it."""

    def __post_init__(self):
        if self.learning_rate < 0 or self.warmup_steps < 0 or self.grad_accum < 1 or self.clip_norm < 0:
            raise ValueError(f"invalid optimizer config {self}")


def lr_schedule(ocfg: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = min(ocfg.warmup_steps, max(total_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else ocfg.learning_rate, peak_value=ocfg.learning_rate, warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1), end_value=ocfg.learning_rate * ocfg.end_lr_ratio)


def decay_mask(cfg: ModelConfig):
    """optax's weight-decay mask as a function of the parameter tree: True for weights with at least two
    non-layer axes (matrices, embeddings), False for norms. A leaf is matched by the trailing dict keys of its path
    to the declared parameter, so the function serves the plain tree and a tree that wraps it (an NNX ``State``
    of ``jf_jax.flax.Transformer``, whose leaves sit under ``params`` and inside ``nnx.Param``)."""
    rule = {}
    for path, axes in jax.tree_util.tree_leaves_with_path(
            logical_axes(cfg), is_leaf=lambda a: isinstance(a, tuple) and all(isinstance(s, str) for s in a)):
        rule[tuple(k.key for k in path)] = sum(a != "layers" for a in axes) >= 2

    def decays(path, _):
        names = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
        for start in range(len(names)):
            if names[start:] in rule:
                return rule[names[start:]]
        raise ValueError(f"no declared parameter matches {jax.tree_util.keystr(path)}")

    return lambda tree: jax.tree_util.tree_map_with_path(decays, tree)


def make_optimizer(cfg: ModelConfig, ocfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    parts = [optax.clip_by_global_norm(ocfg.clip_norm)] if ocfg.clip_norm > 0 else []
    parts.append(optax.adamw(lr_schedule(ocfg, total_steps), b1=ocfg.b1, b2=ocfg.b2, eps=ocfg.eps,
                             weight_decay=ocfg.weight_decay, mask=decay_mask(cfg)))
    return optax.chain(*parts)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array
    """int32 scalar: number of completed optimizer steps."""
    params: Params
    opt_state: optax.OptState


def init_state(params: Params, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def state_shardings(cfg: ModelConfig, optimizer, params_like, mesh: Mesh, rules: ShardingRules) -> TrainState:
    """Shardings of the whole state: optimizer moments follow their parameters, the rest is replicated."""
    p_sh = param_shardings(cfg, params_like, mesh, rules)
    abstract_opt = jax.eval_shape(optimizer.init, params_like)
    opt_sh = optax.tree_map_params(optimizer, lambda _, sh: sh, abstract_opt, p_sh,
                                   transform_non_params=lambda _: replicated(mesh))
    return TrainState(step=replicated(mesh), params=p_sh, opt_state=opt_sh)


def abstract_state(cfg: ModelConfig, optimizer, params_like, shardings: TrainState) -> TrainState:
    """ShapeDtypeStructs of the state carrying its shardings (the target of a checkpoint restore)."""
    shapes = jax.eval_shape(lambda p: init_state(p, optimizer), params_like)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
