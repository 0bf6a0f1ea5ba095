"""The Qwen2 / Llama decoder as pure functions over the parameter pytree of ``jf_jax.model.params``.

``forward`` runs the stacked layers with ``lax.scan``. Without a cache it is the training / full-sequence
forward (attention among the given tokens, masked by their ``TokenMeta``). With a cache the tokens attend to
the committed cache slots plus each other, and their keys/values are written at the cache's current
lengths (not committed: the caller decides how much of the block to keep).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_view import MATMUL_WEIGHTS, DecodeView, Shards
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.token_meta import cache_key_meta, causal_meta, concat_meta
from jf_jax.model.params import Params
from pallas_kernels.mask import MASK_NOISE_CONDITIONED, TokenMeta


def rms_norm(x, weight, eps: float):
    """RMSNorm in float32 (as Hugging Face does), returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * x32).astype(x.dtype)


def rope_tables(positions, head_dim: int, theta: float):
    """cos, sin tables [B, T, 1, Dh/2] of the rotary embedding, computed once per forward.

    Angles are computed in float32: in bfloat16, positions past a few hundred lose the precision to
    distinguish neighbouring tokens.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))  # [Dh/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def rope(x, tables):
    """Rotary embedding, "rotate half" layout (HF Qwen2/Llama). x: [B, T, H, Dh], in float32."""
    cos, sin = tables
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _attend(cfg: ModelConfig, q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, mask_kind: str):
    if cfg.attention_impl == "pallas":
        from pallas_kernels import flash_attention  # imported lazily: only this backend needs it

        return flash_attention.attention(q, k, v, q_meta, k_meta, mask_kind=mask_kind)
    from pallas_kernels import attention_reference

    return attention_reference(q, k, v, q_meta, k_meta, mask_kind=mask_kind)


def dense(equation: str, x, shards: Shards, dtype):
    """``einsum(equation, x, w)`` accumulated in float32, for ``w`` given as ``Shards``: one weight split along
    its last axis (a 1-tuple when unsplit), concatenated back.

    The shards' dots are independent, so XLA's CPU runtime runs them on different cores: a one-token step is
    a chain of matrix-vector products, and one XLA dot runs on a single core.
    """
    outs = [jnp.einsum(equation, x, s.astype(dtype), preferred_element_type=jnp.float32) for s in shards]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-1)


def _layer(cfg: ModelConfig, x, layer: Params, rope_tabs, q_meta, cache_kv, cache_meta, mask_kind):
    """One decoder layer. x: [B, T, D]. Returns the new x and this layer's new (k, v) [B, T, K, Dh]."""
    dt = cfg.compute_dtype

    with jax.named_scope("attention"):
        h = rms_norm(x, layer["attn_norm"], cfg.rms_norm_eps)
        q = dense("btd,dhk->bthk", h, layer["wq"], dt)  # [B, T, H, Dh]
        k = dense("btd,dhk->bthk", h, layer["wk"], dt)  # [B, T, K, Dh]
        v = dense("btd,dhk->bthk", h, layer["wv"], dt)  # [B, T, K, Dh]
        if cfg.attention_bias:
            q = q + layer["bq"].astype(jnp.float32)
            k = k + layer["bk"].astype(jnp.float32)
            v = v + layer["bv"].astype(jnp.float32)
        q = rope(q, rope_tabs).astype(dt)
        k = rope(k, rope_tabs).astype(dt)
        v = v.astype(dt)
        if cache_kv is None:
            keys, values, k_meta = k, v, q_meta
        else:
            cached_k, cached_v = cache_kv  # [B, S, K, Dh]
            keys = jnp.concatenate([cached_k, k], axis=1)
            values = jnp.concatenate([cached_v, v], axis=1)
            k_meta = concat_meta(cache_meta, q_meta)
        attn = _attend(cfg, q, keys, values, q_meta, k_meta, mask_kind)  # [B, T, H, Dh]
        x = x + dense("bthk,hkd->btd", attn, layer["wo"], dt).astype(dt)

    with jax.named_scope("mlp"):
        h = rms_norm(x, layer["mlp_norm"], cfg.rms_norm_eps)
        gate = dense("btd,df->btf", h, layer["w_gate"], dt)
        up = dense("btd,df->btf", h, layer["w_up"], dt)
        act = (jax.nn.silu(gate) * up).astype(dt)
        x = x + dense("btf,fd->btd", act, layer["w_down"], dt).astype(dt)
    return x, (k, v)


def _outer(params: Params | DecodeView):
    """(embedding, final norm weight, output projection as ``Shards`` or None when tied) of either layout."""
    if isinstance(params, DecodeView):
        return params.embed, params.final_norm, params.lm_head
    return params["embed"], params["final_norm"], (params["lm_head"],) if "lm_head" in params else None


def _stack(params: Params | DecodeView, cfg: ModelConfig, tokens, positions, q_meta: TokenMeta, cache: KVCache | None,
           mask_kind: str):
    """Embedding, every layer and the final norm. Returns (hidden, new keys, new values [L, B, T, K, Dh]).

    A one-row cache serves every row of ``tokens`` (broadcast inside each layer, never copied per row).
    """
    B = tokens.shape[0]
    embed, final_norm, _ = _outer(params)
    x = embed.astype(cfg.compute_dtype)[tokens]  # [B, T, D]
    rope_tabs = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    cache_meta = None
    if cache is not None:
        cache_meta = cache_key_meta(jnp.broadcast_to(cache.lengths, (B,)), cache.capacity)
    rows_kv_shape = None if cache is None else (B,) + cache.k.shape[2:]

    def body(x, per_layer):
        layer, cache_kv = per_layer
        if cache_kv is not None:
            cache_kv = tuple(jnp.broadcast_to(c, rows_kv_shape) for c in cache_kv)
        return _layer(cfg, x, layer, rope_tabs, q_meta, cache_kv, cache_meta, mask_kind)

    if isinstance(params, DecodeView):
        # A Python loop over per-layer arrays: no layer's weights are sliced out of a stacked array (on CPU the
        # slice inside scan is a full copy that doubles the weight traffic of a one-token step).
        new_kv = []
        for i, layer in enumerate(params.layers):
            x, kv = body(x, (layer, None if cache is None else (cache.k[i], cache.v[i])))
            new_kv.append(kv)
        new_k, new_v = (jnp.stack(t) for t in zip(*new_kv))
    else:
        # The declared layout: stacked layers under ``lax.scan`` (training), each weight one unsplit shard.
        layers = {k: (w,) if k in MATMUL_WEIGHTS else w for k, w in params["layers"].items()}
        x, (new_k, new_v) = jax.lax.scan(body, x, (layers, None if cache is None else (cache.k, cache.v)))
    return rms_norm(x, final_norm, cfg.rms_norm_eps), new_k, new_v


def _default_positions(tokens, meta, cache):
    B, T = tokens.shape
    if meta is not None:
        return meta.position
    if cache is not None:
        return jnp.broadcast_to(cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32), (B, T))
    return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def forward(params: Params | DecodeView, cfg: ModelConfig, tokens, positions=None, *, meta: TokenMeta | None = None,
            cache: KVCache | None = None, mask_kind: str = MASK_NOISE_CONDITIONED):
    """Runs the decoder stack and returns ``(hidden [B, T, D], cache)``. ``params`` is the declared stacked tree
    (layers under ``lax.scan``) or a ``DecodeView`` (per-layer weights in a Python loop); both give the same
    result.

    tokens: [B, T] int32. positions: [B, T] RoPE positions; defaults to ``meta.position``, else to
    ``cache.lengths + arange(T)`` with a cache and ``arange(T)`` without. meta: per-token mask data of the
    tokens (default: plain causal tokens at ``positions``). With a cache, the returned cache holds the
    block's keys/values written at the old lengths, which are *not* advanced (see ``KVCache.commit``).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    positions = jnp.asarray(_default_positions(tokens, meta, cache) if positions is None else positions, jnp.int32)
    q_meta = causal_meta(positions) if meta is None else meta
    x, new_k, new_v = _stack(params, cfg, tokens, positions, q_meta, cache, mask_kind)
    if cache is not None:
        cache = cache.write(new_k, new_v)
    return x, cache


def forward_shared_prefix(params: Params | DecodeView, cfg: ModelConfig, tokens, cache: KVCache, valid=None):
    """Forwards R candidate rows [R, W] over the committed prefix of a *one-row* cache that they all share.

    Row r's tokens sit at positions ``cache.lengths[0] + arange(W)``; ``valid`` [R, W] (default all) marks
    padding queries as False. The cache is broadcast to the rows inside each layer (never copied per row)
    and not written: returns (hidden [R, W, D], new keys, new values [L, R, W, K, Dh]) so the caller can
    write back only the row it keeps (rejection recycling).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    if cache.batch_size != 1:
        raise ValueError(f"forward_shared_prefix needs a one-row cache, got {cache.batch_size} rows")
    R, W = tokens.shape
    positions = jnp.broadcast_to(cache.lengths[0] + jnp.arange(W, dtype=jnp.int32), (R, W))
    q_meta = causal_meta(positions, valid=None if valid is None else jnp.broadcast_to(valid, (R, W)))
    return _stack(params, cfg, tokens, positions, q_meta, cache, MASK_NOISE_CONDITIONED)


def logits(params: Params | DecodeView, cfg: ModelConfig, hidden):
    """Float32 vocabulary logits of hidden states [..., D] (the tied embedding when there is no lm_head)."""
    dt = cfg.compute_dtype
    embed, _, head = _outer(params)
    if head is not None:
        return dense("...d,dv->...v", hidden.astype(dt), head, dt)
    return jnp.einsum("...d,vd->...v", hidden.astype(dt), embed.astype(dt), preferred_element_type=jnp.float32)


def forward_logits(params: Params | DecodeView, cfg: ModelConfig, tokens, positions=None, **kwargs):
    """``forward`` followed by ``logits`` on every position: returns (logits [B, T, V] float32, cache)."""
    hidden, cache = forward(params, cfg, tokens, positions, **kwargs)
    return logits(params, cfg, hidden), cache
