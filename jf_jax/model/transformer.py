"""The Qwen2 / Qwen3 / Llama decoder as pure functions over the parameter pytree of ``jf_jax.model.params``.

``forward`` takes either layout of the parameters: the declared stacked tree (training: layers under
``lax.scan``) or a ``DecodeView`` (decoding: per-layer weights in a Python loop). ``_layout`` is the one place
that tells the two apart, as ``weight_matmul.matmul`` is for the forms of a matmul weight. Without a cache it is
the training / full-sequence forward (attention among the given tokens, masked by their ``TokenMeta``). With a
cache the tokens attend to the committed cache slots plus each other (``model.cached_attention``: the same
arithmetic for a token however many tokens or rows share its forward), and their keys/values are written at the
cache's current lengths (not committed: the caller decides how much of the block to keep).

Each entry point takes the ``platform`` the program is built for ("cpu", "gpu" or "tpu"; default: this process's
backend). It decides what differs between machines and nothing else: the decode layout's dot rows and RoPE tables
(``_layout``), whether ``cpu_kernels`` may run, and the attention of ``attention_impl: auto``. The planner builds
accelerator programs on a CPU by naming the accelerator (``tuning.plan``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_view import MATMUL_WEIGHTS, DecodeView, Shards
from jf_jax.model.kv_cache import KVCache
from cpu_kernels import PackedWeight
from jf_jax.model.cached_attention import layer_attention
from jf_jax.model.quantize import Int8Weight
from jf_jax.model.token_meta import causal_meta
from jf_jax.model.weight_matmul import DotRows, dot_rows, matmul, this_machine_dot_rows
from jf_jax.model.params import Params
from jf_jax.model.rope import rope, rope_tables
from jf_jax.model.sharding import attention_per_device, constrain_rows
from pallas_kernels.mask import MASK_NOISE_CONDITIONED, TokenMeta


def rms_norm(x, weight, eps: float):
    """RMSNorm in float32 (as Hugging Face does), returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * x32).astype(x.dtype)


def _attend(cfg: ModelConfig, q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, mask_kind: str,
            platform: str | None = None):
    platform = jax.default_backend() if platform is None else platform
    impl = cfg.attention_impl
    if impl == "auto":  # decided at trace time: the kernel on a TPU (Mosaic) or a GPU (Triton), plain JAX elsewhere
        impl = "pallas" if platform in ("tpu", "gpu") else "reference"
    if impl.startswith("pallas"):
        from pallas_kernels import flash_attention  # imported lazily: only this backend needs it

        # "pallas": Mosaic on a TPU, Triton otherwise.
        backend = {"pallas": "tpu" if platform == "tpu" else "triton", "pallas_tpu": "tpu",
                   "pallas_triton": "triton"}[impl]
        kernel = functools.partial(flash_attention.attention, mask_kind=mask_kind, backend=backend,
                                   interpret=platform == "cpu", backward=cfg.attention_backward)
        # A custom call XLA cannot partition: on a mesh each device runs it on its own rows and heads.
        return attention_per_device(kernel, q, k, v, q_meta, k_meta)
    from pallas_kernels import attention_reference

    return attention_reference(q, k, v, q_meta, k_meta, mask_kind=mask_kind)


def _projections(layer: Params, h, fused: str, names, shapes, equation: str, dtype, row_tile):
    """The projections ``names`` of the same input ``h`` (shaped [B, T, *shape]): one call of a fused prepared
    weight (``decode_view.FUSED``, [D, sum of the outputs]) when the layer holds it, else one matmul per weight."""
    if fused not in layer:
        return [matmul(equation, h, layer[n], dtype, row_tile) for n in names]
    out = matmul("btd,dn->btn", h, layer[fused], dtype, row_tile)
    ends = list(itertools.accumulate(math.prod(s) for s in shapes))
    return [part.reshape(h.shape[:2] + s) for part, s in zip(jnp.split(out, ends[:-1], axis=-1), shapes)]


def _layer(cfg: ModelConfig, x, layer: Params, rope_tabs, q_meta, cache_kv, mask_kind, layout: "_Layout",
           whole_cache: bool = False):
    """One decoder layer. x: [B, T, D]; ``cache_kv`` is None (attention among the tokens, by ``q_meta``) or
    (cached keys, cached values [L, Bc, S, K, Dh], this layer's index in them, lengths), read by
    ``layer_attention`` (``whole_cache`` as there). Returns the new x, this layer's new (k, v) [B, T, K, Dh] and the
    caches as ``layer_attention`` passes them on (None without a cache)."""
    dt, row_tile = cfg.compute_dtype, layout.dot_rows.tile

    with jax.named_scope("attention"):
        h = rms_norm(x, layer["attn_norm"], cfg.rms_norm_eps)
        heads = ((cfg.num_heads, cfg.head_dim), (cfg.num_kv_heads, cfg.head_dim), (cfg.num_kv_heads, cfg.head_dim))
        q, k, v = _projections(layer, h, "w_qkv", ("wq", "wk", "wv"), heads, "btd,dhk->bthk", dt, row_tile)
        if cfg.attention_bias:
            q = q + layer["bq"].astype(jnp.float32)
            k = k + layer["bk"].astype(jnp.float32)
            v = v + layer["bv"].astype(jnp.float32)
        if cfg.qk_norm:  # Qwen3: per-head RMSNorm of queries and keys, before RoPE
            q = rms_norm(q, layer["q_norm"], cfg.rms_norm_eps)
            k = rms_norm(k, layer["k_norm"], cfg.rms_norm_eps)
        q = rope(q, rope_tabs).astype(dt)
        k = rope(k, rope_tabs).astype(dt)
        v = v.astype(dt)
        read = None
        if cache_kv is None:
            attn = _attend(cfg, q, k, v, q_meta, q_meta, mask_kind, layout.platform)  # [B, T, H, Dh]
        else:
            cached_k, cached_v, index, lengths = cache_kv
            attn, *read = layer_attention(q, k, v, q_meta.segment >= 0, cached_k, cached_v, lengths, index,
                                          whole_cache=whole_cache, use_kernel=layout.cpu_kernels)
        x = x + matmul("bthk,hkd->btd", attn, layer["wo"], dt, row_tile).astype(dt)

    with jax.named_scope("mlp"):
        h = rms_norm(x, layer["mlp_norm"], cfg.rms_norm_eps)
        ff = ((cfg.intermediate_size,),) * 2
        gate, up = _projections(layer, h, "w_gate_up", ("w_gate", "w_up"), ff, "btd,df->btf", dt, row_tile)
        act = (jax.nn.silu(gate) * up).astype(dt)
        x = x + matmul("btf,fd->btd", act, layer["w_down"], dt, row_tile).astype(dt)
    return x, (k, v), read


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Either layout of the parameters, as the forward reads it (trace-time only)."""

    embed: jax.Array
    """The [V, D] embedding table (traced only where a tied, unsplit output projection multiplies it)."""
    embedding_rows: Callable
    """tokens -> their embedding rows, in the table's dtype (``DecodeView.embedding_rows``)."""
    final_norm: jax.Array
    lm_head: Shards | PackedWeight | Int8Weight | None
    """The output projection in any matmul form; None for tied embeddings held unsplit (the embedding is reused)."""
    dot_rows: DotRows
    """``this_machine_dot_rows`` of the compute dtype when decoding: every row is computed alike however many share
    a dot. In training no tile (XLA picks its fastest dot for the whole batch), and a lone cached token is padded to
    two rows as in decoding."""
    rope_unfused: bool
    """``rope_tables(unfused=...)``: on CPU in the decode layout, whose unrolled layers would each recompute them."""
    run_layers: Callable
    """(body, x, cache) -> (x, new keys, new values [L, B, T, K, Dh], the cache as read, None without one): every
    layer's ``body(x, (layer, kv))``."""
    platform: str
    """The platform the program is built for: "cpu", "gpu" or "tpu" (``forward``'s ``platform``)."""

    @property
    def cpu_kernels(self) -> bool:
        return cpu_kernels_allowed(self.platform)


def cpu_kernels_allowed(platform: str) -> bool:
    """Whether ``cpu_kernels`` may run in a program built for ``platform`` (where they are available): only in one
    built for a CPU (an exported or cross-compiled program for an accelerator must not call them)."""
    return platform == "cpu"


def decode_dot_rows(dtype: str, platform: str) -> DotRows:
    """``weight_matmul.dot_rows`` of a decode program built for ``platform``: this machine's (its CPU's features
    included) when that is the platform this process runs on, else the platform's own."""
    if platform == jax.default_backend():
        return this_machine_dot_rows(dtype)
    return dot_rows(dtype, platform, None)


def _layout(params: Params | DecodeView, cfg: ModelConfig, platform: str | None = None) -> _Layout:
    """The one place the forward tells the stacked tree (training) from the ``DecodeView`` (decoding), for a program
    built for ``platform`` (default: this process's backend)."""
    platform = jax.default_backend() if platform is None else platform
    if isinstance(params, DecodeView):
        return _Layout(params.embedding_table(), params.embedding_rows, params.final_norm, params.lm_head,
                       decode_dot_rows(cfg.dtype, platform), platform == "cpu",
                       functools.partial(_loop_layers, params.layers), platform)
    # The declared layout: each matmul weight is one unsplit shard.
    layers = {k: (w,) if k in MATMUL_WEIGHTS else w for k, w in params["layers"].items()}
    lm_head = (params["lm_head"],) if "lm_head" in params else None
    return _Layout(params["embed"], lambda tokens: params["embed"][tokens], params["final_norm"], lm_head,
                   DotRows(2, None), False, functools.partial(_scan_layers, layers, cfg.remat), platform)


def _loop_layers(layers: tuple[dict, ...], body, x, cache: KVCache | None):
    """A Python loop over per-layer arrays: no layer's weights are sliced out of a stacked array (on CPU the
    slice inside scan is a full copy that doubles the weight traffic of a one-token step). Each layer is given
    the whole cache and its index, for the same reason: attention reads its layer where it lies, and passes the
    cache on to the next layer (``layer_attention``); the cache the last layer passes on is returned, for the write."""
    new_kv = []
    read = None if cache is None else (cache.k, cache.v)
    for i, layer in enumerate(layers):
        x, kv, read = body(x, (layer, None if read is None else (*read, i)))
        new_kv.append(kv)
    new_k, new_v = (jnp.stack(t) for t in zip(*new_kv))
    return x, new_k, new_v, None if cache is None else dataclasses.replace(cache, k=read[0], v=read[1])


def _scan_layers(layers: dict, remat: bool, body, x, cache: KVCache | None):
    """Stacked layers under ``lax.scan`` (rematerialised per layer with ``remat``); each layer's slice of the cache
    is its body's cache of one layer."""
    def step(x, per_layer):
        layer, kv = per_layer
        x, new_kv, _ = body(constrain_rows(x), (layer, None if kv is None else (kv[0][None], kv[1][None], 0)))
        return x, new_kv

    step = jax.checkpoint(step) if remat else step
    x, (new_k, new_v) = jax.lax.scan(step, x, (layers, None if cache is None else (cache.k, cache.v)))
    return x, new_k, new_v, cache


def _stack(params: Params | DecodeView, cfg: ModelConfig, tokens, positions, q_meta: TokenMeta, cache: KVCache | None,
           mask_kind: str, whole_cache: bool = False, platform: str | None = None):
    """Embedding, every layer and the final norm. Returns (hidden, new keys, new values [L, B, T, K, Dh], the cache
    as the layers pass it on: what a write of the new keys goes into, ``_loop_layers``; None without a cache).

    With a cache the tokens attend through ``layer_attention``; a cache of Bc rows serves B rows of ``tokens``
    in groups of B // Bc (shared inside each layer, never copied per row), and fewer tokens than the layout's
    ``DotRows.fewest`` are run with padding tokens after them (``_pad_tokens``).
    """
    B, T = tokens.shape
    layout = _layout(params, cfg, platform)
    if cache is not None and B * T < layout.dot_rows.fewest:
        padded = _pad_tokens(tokens, positions, q_meta, -(-layout.dot_rows.fewest // B))
        x, new_k, new_v, read = _stack(params, cfg, *padded, cache, mask_kind, whole_cache, platform)
        return x[:, :T], new_k[:, :, :T], new_v[:, :, :T], read
    x = layout.embedding_rows(tokens).astype(cfg.compute_dtype)  # [B, T, D]
    rope_tabs = rope_tables(positions, cfg, unfused=layout.rope_unfused)

    def body(x, per_layer):
        layer, cache_kv = per_layer
        if cache_kv is not None:
            cache_kv = cache_kv + (cache.lengths,)
        return _layer(cfg, x, layer, rope_tabs, q_meta, cache_kv, mask_kind, layout, whole_cache)

    x, new_k, new_v, read = layout.run_layers(body, x, cache)
    return rms_norm(x, layout.final_norm, cfg.rms_norm_eps), new_k, new_v, read


def _pad_tokens(tokens, positions, q_meta: TokenMeta, width: int):
    """Each row's tokens followed by padding tokens (copies of its last, segment -1, at the next positions) up to
    ``width``: XLA:CPU computes a dot of one row (on some CPUs two, ``weight_matmul.DotRows``) with other kernels,
    whose results differ from the same token's inside a block (a one-row GEMV is also slower, converting bfloat16
    weights to float32 on every call). Causal order keeps the real tokens from seeing the padding."""
    B, T = tokens.shape
    after = jnp.arange(1, width - T + 1, dtype=jnp.int32)

    def extend(a, step=0):
        return jnp.concatenate([a, jnp.broadcast_to(a[:, -1:] + step, (B, width - T))], axis=1)

    meta = TokenMeta(position=extend(q_meta.position, after), stream=extend(q_meta.stream),
                     block=extend(q_meta.block),
                     segment=jnp.concatenate([q_meta.segment, jnp.full((B, width - T), -1, q_meta.segment.dtype)],
                                             axis=1))
    return extend(tokens), extend(positions, after), meta


def _default_positions(tokens, meta, cache):
    B, T = tokens.shape
    if meta is not None:
        return meta.position
    if cache is not None:
        return jnp.broadcast_to(cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32), (B, T))
    return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def forward(params: Params | DecodeView, cfg: ModelConfig, tokens, positions=None, *, meta: TokenMeta | None = None,
            cache: KVCache | None = None, mask_kind: str = MASK_NOISE_CONDITIONED, whole_cache: bool = False,
            platform: str | None = None):
    """Runs the decoder stack and returns ``(hidden [B, T, D], cache)``. ``params`` is the declared stacked tree
    (layers under ``lax.scan``) or a ``DecodeView`` (per-layer weights in a Python loop); both give the same
    result.

    tokens: [B, T] int32. positions: [B, T] RoPE positions; defaults to ``meta.position``, else to
    ``cache.lengths + arange(T)`` with a cache and ``arange(T)`` without. meta: per-token mask data of the
    tokens (default: plain causal tokens at ``positions``). With a cache, the returned cache holds the
    block's keys/values written at the old lengths, which are *not* advanced (see ``KVCache.commit``).
    ``whole_cache``: attention over every cache slot in position order (fixed-shape decoding, ``decoding.shapes``).
    ``platform``: the platform the program is built for ("cpu", "gpu", "tpu"; default: this process's backend).
    """
    platform = jax.default_backend() if platform is None else platform
    tokens = jnp.asarray(tokens, jnp.int32)
    positions = jnp.asarray(_default_positions(tokens, meta, cache) if positions is None else positions, jnp.int32)
    q_meta = causal_meta(positions) if meta is None else meta
    x, new_k, new_v, read = _stack(params, cfg, tokens, positions, q_meta, cache, mask_kind, whole_cache, platform)
    if cache is not None:
        cache = read.write(new_k, new_v, use_kernel=cpu_kernels_allowed(platform))
    return x, cache


def forward_shared_prefix(params: Params | DecodeView, cfg: ModelConfig, tokens, cache: KVCache, valid=None,
                          whole_cache: bool = False, platform: str | None = None):
    """Forwards candidate rows [Bc*R, W] over the committed prefix of a cache of Bc rows, R rows per cache row
    (rows ``b*R ... b*R + R - 1`` read cache row b; Bc == 1: every row shares one).

    Row r's tokens sit at positions ``lengths[r // R] + arange(W)``; ``valid`` [Bc*R, W] (default all) marks
    padding queries as False. A cache row is shared by its R rows inside each layer (never copied per row)
    and not written: returns (hidden [Bc*R, W, D], new keys, new values [L, Bc*R, W, K, Dh], the cache as the layers
    pass it on) so the caller can write back only the row it keeps (rejection recycling), into that cache: the
    write then follows every layer's read, and XLA does it in place (``layer_attention``). ``whole_cache`` and
    ``platform`` as in ``forward``.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    rows, W = tokens.shape
    if rows % cache.batch_size:
        raise ValueError(f"forward_shared_prefix: {rows} rows are not a multiple of the cache's "
                         f"{cache.batch_size} rows")
    starts = jnp.repeat(cache.lengths, rows // cache.batch_size)
    positions = starts[:, None] + jnp.arange(W, dtype=jnp.int32)
    q_meta = causal_meta(positions, valid=None if valid is None else jnp.broadcast_to(valid, (rows, W)))
    return _stack(params, cfg, tokens, positions, q_meta, cache, MASK_NOISE_CONDITIONED, whole_cache, platform)


def logits(params: Params | DecodeView, cfg: ModelConfig, hidden, platform: str | None = None):
    """Float32 vocabulary logits of hidden states [..., D] (the tied embedding when there is no lm_head).

    Fewer rows than the layout's ``DotRows.fewest`` are padded with copies of the last (as ``_pad_tokens`` pads a
    forward's tokens), so a row's logits equal that row's inside any batch. ``platform`` as in ``forward``.
    """
    dt = cfg.compute_dtype
    layout = _layout(params, cfg, platform)
    rows = hidden.reshape(-1, hidden.shape[-1]).astype(dt)
    if rows.shape[0] < layout.dot_rows.fewest:
        rows = jnp.concatenate([rows] + [rows[-1:]] * (layout.dot_rows.fewest - rows.shape[0]))
    if layout.lm_head is None:  # tied: the embedding [V, D], one unsplit shard contracted on its last axis
        out = matmul("nd,vd->nv", rows, (layout.embed,), dt, layout.dot_rows.tile, lead=1)
    else:
        out = matmul("nd,dv->nv", rows, layout.lm_head, dt, layout.dot_rows.tile, lead=1)
    return out[: math.prod(hidden.shape[:-1])].reshape(hidden.shape[:-1] + (out.shape[-1],))


def forward_logits(params: Params | DecodeView, cfg: ModelConfig, tokens, positions=None, **kwargs):
    """``forward`` followed by ``logits`` on every position: returns (logits [B, T, V] float32, cache)."""
    hidden, cache = forward(params, cfg, tokens, positions, **kwargs)
    return logits(params, cfg, hidden, kwargs.get("platform")), cache
