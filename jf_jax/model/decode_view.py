"""The decoders' view of the parameters: the same values as the declared (stacked) tree, held per layer.

Training keeps the layout ``params.param_specs`` declares: layers stacked on a leading axis and run with
``lax.scan``. A decode program is different: on CPU, slicing a layer out of a stacked array inside ``scan`` is a
full copy that doubles the weight traffic of a one-token step, and one XLA dot runs on one core. So decoders
take a ``DecodeView``: per-layer arrays (walked by a Python loop, nothing sliced), and every matmul weight held
as ``column_shards`` shards along its output axis, so the shards' independent dots run on different cores.

The view is an explicit type that ``model.transformer.forward`` accepts beside the stacked tree; nothing
inspects array containers to guess a layout. ``decode_view`` builds it, ``stacked_params`` gives back the
declared tree; both move values only, so ``stacked_params(decode_view(p), cfg) == p``. The layout is chosen once,
when a model is loaded (``api.load_model``, by the rule ``model.machine.decode_view_for``) or when stacked params
are converted here; decoders take the view, and ``as_decode_view`` is the one place a decoder looks at which
layout it was handed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp

from cpu_kernels import PackedWeight, pack_weight
from cpu_kernels.bf16_gemm import unpack_weight
from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params
from jf_jax.model.quantize import Int8Weight, dequantize_weight, quantize_weight

# Weights that multiply activations as ``x @ w`` with the output on w's last axis: the ones split into shards
# (or packed), with how many leading axes of each are contracted.
MATMUL_WEIGHTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
CONTRACTED_AXES = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}
# Packed views fuse the weights that multiply the same input into one matrix (one kernel call instead of three
# or two: each call costs ~10-20 us of fixed overhead, a tenth of a small weight's streaming time).
FUSED = {"w_qkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}

Shards = tuple  # tuple[jax.Array, ...]: one weight split along its last (output) axis


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeView:
    """Per-layer parameters for decoding (a pytree; ``column_shards`` is static)."""

    embed: jax.Array
    """[V, D] token embedding, or its bits (``embed_dtype``); read it with ``embedding_rows`` / ``embedding_table``."""
    layers: tuple[dict, ...]
    """One dict per layer: norms and biases as arrays, ``MATMUL_WEIGHTS`` as ``Shards``, ``PackedWeight`` or
    ``Int8Weight`` (the last two fused per ``FUSED``)."""
    final_norm: jax.Array
    """[D]."""
    lm_head: Shards | PackedWeight | Int8Weight | None
    """[D, V] output projection as shards, packed or int8; None for tied embeddings held unsplit (the embedding is
    reused)."""
    column_shards: int = dataclasses.field(default=1, metadata=dict(static=True))
    embed_dtype: str | None = dataclasses.field(default=None, metadata=dict(static=True))
    """None: ``embed`` is the table. A bfloat16 or float16 table is held as its bits (uint16), and this names its
    dtype. XLA:CPU gathers a 16-bit float array by converting all of it to float32 first (its float normalization);
    inside a decode loop that convert of the whole table is loop-invariant, so XLA hoists it and every decode call
    paid a float32 copy of the table (113 MB, about 60 ms on SmolLM2-135M on two cores). Integers are gathered as
    they are, and a gathered row's bits are its value."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def embedding_rows(self, tokens) -> jax.Array:
        """The embedding rows of ``tokens`` [...], [..., D] in the table's dtype."""
        rows = self.embed[tokens]
        return rows if self.embed_dtype is None else jax.lax.bitcast_convert_type(rows, self.embed_dtype)

    def embedding_table(self) -> jax.Array:
        """The [V, D] table in its dtype (a tied output projection held unsplit multiplies it)."""
        return self.embed if self.embed_dtype is None else jax.lax.bitcast_convert_type(self.embed, self.embed_dtype)


def _split(w, n: int) -> Shards:
    return tuple(jnp.array(s) for s in jnp.array_split(w, n, axis=-1))


def decode_view(params: Params, column_shards: int = 1, pack: bool = False, int8: bool = False) -> DecodeView:
    """The decode view of the declared (stacked) ``params``.

    With ``column_shards`` > 1 the output projection is split too (for tied embeddings: a transposed copy of
    the embedding, the price of using every core for the largest matmul of a step). With ``pack`` every matmul
    weight, the output projection included, is packed for ``cpu_kernels.gemm`` (bfloat16; the kernel uses every
    core itself, so ``column_shards`` must be 1). With ``int8`` they are quantised instead (``model.quantize``:
    W8A8, a lossy approximation of the model); the embedding table itself keeps its dtype.
    """
    if not isinstance(column_shards, int) or column_shards < 1:
        raise ValueError(f"column_shards must be a positive integer, got {column_shards!r}")
    if (pack or int8) and column_shards != 1:
        raise ValueError("packed or int8 weights are not split in column shards")
    if pack and int8:
        raise ValueError("choose one of pack (bfloat16 kernel) and int8")
    prepare = quantize_weight if int8 else pack_weight
    stacked = params["layers"]
    num_layers = next(iter(stacked.values())).shape[0]

    def layer(i: int) -> dict:
        out = {k: v[i] for k, v in stacked.items() if k not in MATMUL_WEIGHTS}
        if not (pack or int8):
            return out | {k: _split(stacked[k][i], column_shards) for k in MATMUL_WEIGHTS}
        fused = {f: prepare(jnp.concatenate([stacked[n][i].reshape(stacked[n].shape[1], -1) for n in names], -1))
                 for f, names in FUSED.items()}
        return out | fused | {"wo": prepare(stacked["wo"][i], 2), "w_down": prepare(stacked["w_down"][i])}

    layers = tuple(layer(i) for i in range(num_layers))
    if "lm_head" in params:
        lm_head = prepare(params["lm_head"]) if pack or int8 else _split(params["lm_head"], column_shards)
    elif pack or int8:
        lm_head = prepare(params["embed"].T)
    else:
        lm_head = _split(params["embed"].T, column_shards) if column_shards > 1 else None
    embed, embed_dtype = params["embed"], None
    if embed.dtype in (jnp.bfloat16, jnp.float16):  # held as its bits: DecodeView.embed_dtype says why
        embed, embed_dtype = jax.lax.bitcast_convert_type(embed, jnp.uint16), embed.dtype.name
    return DecodeView(embed=embed, layers=layers, final_norm=params["final_norm"], lm_head=lm_head,
                      column_shards=column_shards, embed_dtype=embed_dtype)


def as_decode_view(params: Params | DecodeView) -> DecodeView:
    """The parameters a decoder runs on: a ``DecodeView`` (what ``api.load_model`` returns) as it is, the stacked
    training tree converted with ``decode_view``'s defaults (one unsplit shard per weight, nothing packed).

    Every decoding entry point goes through here, so the layout question is asked in one place. A conversion
    copies the weights, once per call: code that decodes a stacked tree many times converts it once itself.
    """
    return params if isinstance(params, DecodeView) else decode_view(params)


def stacked_params(view: DecodeView, cfg: ModelConfig) -> Params:
    """The declared (stacked) layout of ``view``: the inverse of ``decode_view``."""
    unprepare = {PackedWeight: unpack_weight, Int8Weight: lambda w: dequantize_weight(w, cfg.weight_dtype)}

    def join(w) -> jax.Array:
        """One matmul weight in any form (``Shards`` or prepared) as one array."""
        undo = unprepare.get(type(w))
        if undo is not None:
            return undo(w)
        return jnp.concatenate(w, axis=-1) if len(w) > 1 else w[0]

    shapes = {"wq": (cfg.num_heads, cfg.head_dim), "wk": (cfg.num_kv_heads, cfg.head_dim),
              "wv": (cfg.num_kv_heads, cfg.head_dim), "w_gate": (cfg.intermediate_size,),
              "w_up": (cfg.intermediate_size,)}

    def unfused(layer: dict) -> dict:
        out = dict(layer)
        for f, names in FUSED.items():
            if f in out:
                w = join(out.pop(f))
                ends = list(itertools.accumulate(math.prod(shapes[n]) for n in names))
                for n, part in zip(names, jnp.split(w, ends[:-1], axis=-1)):
                    out[n] = (part.reshape(w.shape[:1] + shapes[n]),)  # one unsplit shard, as joined below
        return out

    per_layer = [unfused(layer) for layer in view.layers]
    layers = {k: jnp.stack([join(layer[k]) if k in MATMUL_WEIGHTS else layer[k] for layer in per_layer])
              for k in per_layer[0]}
    out = {"embed": view.embedding_table(), "layers": layers, "final_norm": view.final_norm}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = join(view.lm_head)
    return out
