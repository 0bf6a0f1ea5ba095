"""A Flax NNX face on the functional model: ``jf_jax.flax.Transformer`` is an ``nnx.Module`` whose state is exactly
the declared parameter tree (``jf_jax.model.params``), and whose call runs the same ``forward`` function.

::

    from flax import nnx
    import jf_jax.flax as jfx

    model = jfx.Transformer.from_pretrained("smollm2-135m", dtype="bfloat16")   # or Transformer(cfg, rngs=...)
    logits = model(tokens)                       # [B, T] int32 -> float32 [B, T, V]
    graphdef, state = nnx.split(model)
    params = jfx.functional_params(model)        # the pytree the decoders and the train step take
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

There is no second model implementation: parameters are declared once (``param_specs``), each leaf becomes an
``nnx.Param`` carrying its logical axes as metadata (``logical_axes``), and ``__call__`` is
``model.transformer.forward_logits`` on those values. ``jacobi_forcing_loss(model, batch, lcfg)`` is the training
loss of ``jf_jax.training.losses`` on the module, for ``nnx.grad`` / ``nnx.Optimizer`` loops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params, check_params, init_params, logical_axes
from jf_jax.model.transformer import forward_logits
from jf_jax.training.losses import LossConfig, loss_fn

__all__ = ["Transformer", "functional_params", "jacobi_forcing_loss"]


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


class Transformer(nnx.Module):
    """The jf-jax decoder as an ``nnx.Module``: ``self.params`` is the declared tree with ``nnx.Param`` leaves."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs | None = None, params: Params | None = None):
        if (rngs is None) == (params is None):
            raise ValueError("Transformer needs exactly one of rngs (fresh weights) or params (given weights)")
        self.cfg = cfg
        if params is None:
            params = init_params(cfg, rngs.params())
        check_params(cfg, params, source="Transformer params")
        axes = logical_axes(cfg)
        self.params = nnx.data(jax.tree.map(lambda value, names: nnx.Param(value, logical_axes=names), params, axes,
                                            is_leaf=lambda x: not isinstance(x, dict)))

    @classmethod
    def from_pretrained(cls, spec: str, dtype: str = "float32") -> "Transformer":
        """Any model ``jf_jax.weights.load`` takes (a name, .gguf, HF directory or training run), in ``dtype``
        ("float32" or "bfloat16")."""
        from jf_jax import weights

        loaded = weights.load(spec, dtype=dtype)
        return cls(loaded.cfg, params=loaded.params)

    def __call__(self, tokens) -> jax.Array:
        """[B, T] int32 token ids -> float32 logits [B, T, V] (a causal forward of the whole sequence)."""
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, length] int32, got shape {tokens.shape}")
        logits, _ = forward_logits(functional_params(self), self.cfg, tokens)
        return logits


def functional_params(model: Transformer) -> Params:
    """The module's parameters as the plain pytree of ``jf_jax.model.params`` (what decoders and training take)."""
    return jax.tree.map(lambda p: p[...], model.params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def jacobi_forcing_loss(model: Transformer, batch, lcfg: LossConfig,
                        reference: Transformer | None = None) -> tuple[jax.Array, dict]:
    """The Jacobi Forcing loss (consistency + AR, ``training.losses.loss_fn``) of a packed batch on the module;
    ``reference`` is the frozen module ``lcfg.ar_teacher="reference"`` distils from."""
    ref = None if reference is None else jax.lax.stop_gradient(functional_params(reference))
    return loss_fn(functional_params(model), model.cfg, batch, lcfg, reference=ref)
