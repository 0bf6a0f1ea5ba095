"""Attention of a block of new tokens over a KV cache: cost that follows the live prefix, and the same
arithmetic for a token whatever else shares its forward.

Greedy Jacobi decoding is lossless only if a token's logits do not depend on how the token was computed: in
a one-token AR step or inside a 16-token draft block, next to 0 or 7 recycled candidate rows, in a batch of 1
or 8 prompts. Dense layers get it from the row counts their dots are given (``weight_matmul.DotRows``: short
forwards padded, long ones tiled). Attention is where it breaks when each forward concatenates the cache with
its own block: the key sequence then has a different length and the new keys sit elsewhere, so the reductions
differ. Here the keys are cut into fixed chunks of ``CHUNK`` slots *aligned to absolute positions* (chunk c
holds positions ``c*CHUNK ...``), and for every query:

* the softmax maximum is taken over all visible keys (a max is exact in any order);
* each chunk's exp-sum and probability-weighted value sum are computed with the same shapes per query row;
* the chunks' partial sums are added in increasing chunk order. A chunk the query cannot see contributes exact
  zeros, and ``x + 0 == x``, so it does not matter how many invisible chunks a forward carries.

So a query at position p gets the same bits whether its keys past the committed length came from its own
block or were committed by earlier forwards: AR, Jacobi, multi-block and recycled rows share their arithmetic.

Keys are read in two parts. Part A: the committed chunks strictly below ``lengths // CHUNK`` (the same for
every row that shares a cache row), read from the cache under a ``lax.switch`` over power-of-two chunk counts,
so a step costs what the cache holds, not its capacity, and one compiled program serves every length. Part B:
the *frontier*, the few chunks from ``lengths // CHUNK`` on, where committed keys and the block's new keys
meet; each query row assembles it from the cache and its own block (nothing else is copied, so R candidate
rows can share one cache row). The block is written into the cache afterwards by the caller.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

import cpu_kernels
from jf_jax.model.kv_cache import LAYOUT as CACHE_LAYOUT
from jf_jax.model.sharding import HEADS, ROWS, per_device

CHUNK = 64
_MASKED = -1e30  # finite: a query that sees no key at all gets exact zeros instead of NaN


def part_a_sizes(capacity: int, chunk: int = CHUNK) -> tuple[int, ...]:
    """Chunk counts of the committed-prefix programs: 0, 1, 2, 4, ... up to every full chunk of the cache."""
    top = capacity // chunk
    sizes, size = [0], 1
    while size < top:
        sizes.append(size)
        size *= 2
    return tuple(sizes) + ((top,) if top > 0 else ())


# Compute dtypes whose attention dots take the query token and the key chunk as *batch* dimensions: every
# contraction is then a dot of one shape (a query's heads against one chunk of keys) however many tokens and
# chunks share the forward. XLA:CPU's float32 dot kernels otherwise change summation order with the number of
# query rows or keys on some CPUs (AVX2: 1, 2 and 8 tokens differ from 4 and 16), while the batched bfloat16 dots
# here keep one order (checked with up to 280 query rows per dot on an AMX CPU, ``tests/test_dot_rows.py``). The
# price is a copy of the visible keys and values per query token.
PER_TOKEN_DOTS = ("float32",)


def _per_row(cache_rows, B: int):
    """``cache_rows`` [Bc, ...] as one cache row per query row [B, ...] (Bc is 1 or B here)."""
    return jnp.broadcast_to(cache_rows, (B,) + cache_rows.shape[1:]) if cache_rows.shape[0] != B else cache_rows


def _scores(q, keys, shared: bool, scale: float, chunk: int):
    """q [B, T, K, G, Dh] against keys [Bc, S, K, Dh] (S a multiple of ``chunk``) -> float32 scores [B, K, G, T, S]."""
    if q.dtype.name in PER_TOKEN_DOTS:
        (B, T), (_, S, K, Dh) = q.shape[:2], keys.shape
        n = S // chunk
        keys = _per_row(keys, B).reshape(B, n, chunk, K, Dh).transpose(0, 1, 3, 2, 4)  # [B, n, K, chunk, Dh]
        keys = jnp.broadcast_to(keys[:, None], (B, T) + keys.shape[1:])
        q = jnp.broadcast_to(q[:, :, None], (B, T, n) + q.shape[2:])  # [B, T, n, K, G, Dh]
        # Batch axes leading and in the output's order: XLA then runs one [G, Dh] x [Dh, chunk] dot per batch
        # element (an einsum whose output needs a transpose let it reorder operands differently for n == 1).
        out = jax.lax.dot_general(q, keys, (((5,), (5,)), ((0, 1, 2, 3), (0, 1, 2, 3))),
                                  preferred_element_type=jnp.float32) * scale  # [B, T, n, K, G, chunk]
        return out.transpose(0, 3, 4, 1, 2, 5).reshape(B, K, q.shape[4], T, S)
    if shared:  # one cache row for all B query rows: the rows become more rows (M) of one dot per head
        return jnp.einsum("btkgd,skd->bkgts", q, keys[0], preferred_element_type=jnp.float32) * scale
    return jnp.einsum("btkgd,bskd->bkgts", q, keys, preferred_element_type=jnp.float32) * scale


def _chunk_sums(probs, values, shared: bool, chunk: int):
    """Per-chunk (exp-sums [B, K, G, T, n], value sums [B, K, G, T, n, Dh]) of probs [B, K, G, T, n*chunk]."""
    B, K, G, T, S = probs.shape
    n = S // chunk
    p = probs.reshape(B, K, G, T, n, chunk)
    sums = jnp.sum(p, axis=-1)
    p = p.astype(values.dtype)
    if values.dtype.name in PER_TOKEN_DOTS:
        v = _per_row(values, B).reshape(B, n, chunk, K, -1).transpose(0, 1, 3, 2, 4)  # [B, n, K, chunk, Dh]
        v = jnp.broadcast_to(v[:, None], (B, T) + v.shape[1:])
        acc = jax.lax.dot_general(p.transpose(0, 3, 4, 1, 2, 5), v, (((5,), (4,)), ((0, 1, 2, 3), (0, 1, 2, 3))),
                                  preferred_element_type=jnp.float32)  # [B, T, n, K, G, Dh], as _scores
        acc = acc.transpose(0, 3, 4, 1, 2, 5)
    elif shared:
        v = values[0].reshape(n, chunk, K, -1)
        acc = jnp.einsum("bkgtnc,nckd->bkgtnd", p, v, preferred_element_type=jnp.float32)
    else:
        v = values.reshape(values.shape[0], n, chunk, K, -1)
        acc = jnp.einsum("bkgtnc,bnckd->bkgtnd", p, v, preferred_element_type=jnp.float32)
    return sums, acc


def _fold(total_l, total_acc, sums, acc):
    """Adds chunk partials to the running totals one chunk at a time, in chunk order (never as a tree)."""
    for i in range(sums.shape[-1]):
        total_l = total_l + sums[..., i]
        total_acc = total_acc + acc[..., i, :]
    return total_l, total_acc


def _kernel_runs(head_dim: int, dtype) -> bool:
    """Whether the CPU decode-attention kernel runs here for this head size and dtype (False: plain JAX)."""
    return cpu_kernels.attention_available() and cpu_kernels.attention_supports(head_dim, dtype)


_TOKENS = (ROWS, None, HEADS, None)
"""``sharding.per_device``'s layout of q, k_new, v_new and the output [B, T, H or K, Dh], and of one layer's cache
[Bc, S, K, Dh]: rows over the batch axes, heads over ``tensor``."""


def _per_device(kernel, q, k_new, v_new, new_valid, cache_k, cache_v, lengths, cache_layout, out_layouts):
    """``kernel(q, k_new, v_new, new_valid, cache_k, cache_v, lengths)``, a decode attention (a CPU kernel or the
    plain-JAX one), run by each device on its own rows and heads under the mesh the program is traced under
    (``sharding.per_device``; as it is outside one). A query row reads only its cache row and a query head only its
    KV head, so nothing moves between devices: XLA cannot partition a kernel's call and would gather the whole cache
    around it, and it partitions the plain-JAX attention's per-row gathers from a row-split cache into all-reduces
    and collective-permutes of the cache. Rows are split only where the query rows B and the cache rows Bc both
    divide, which keeps each query row on its cache row's device. Caches a kernel returns aliased stay aliased,
    each device's block to its own input."""
    lengths = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), cache_k.shape[-4:-3])  # [Bc]: one per cache row
    layouts = (_TOKENS, _TOKENS, _TOKENS, (ROWS, None), cache_layout, cache_layout, (ROWS,))
    return per_device(kernel, (q, k_new, v_new, new_valid, cache_k, cache_v, lengths), layouts, out_layouts)


def layer_attention(q, k_new, v_new, new_valid, cache_k, cache_v, lengths, layer: int, *, whole_cache: bool = False,
                    use_kernel: bool = True):
    """Layer ``layer``'s attention over every layer's cache, cache_k and cache_v [L, Bc, S, K, Dh]: returns (out,
    cache_k, cache_v), the caches unchanged, for the next layer and for the step's write.

    Where a CPU kernel runs (and ``use_kernel``: False in a program built for another platform), it reads the layer
    in place and its call returns the caches aliased to its inputs, so a forward that hands them from layer to layer
    and writes into the last layer's makes its write follow every read (XLA then writes a decode loop's cache in
    place instead of copying it whole each step). Elsewhere the layer's slice goes to ``cached_attention`` (or, with
    ``whole_cache``, ``whole_cache_attention``). Other arguments as ``cached_attention``.
    """
    if (use_kernel and not whole_cache and _kernel_runs(q.shape[-1], q.dtype) and cache_k.dtype == q.dtype
            and cache_v.dtype == q.dtype):
        kernel = functools.partial(cpu_kernels.decode_attention_in_cache, layer=layer)
        out, cache_k, cache_v = _per_device(kernel, q, k_new, v_new, new_valid, cache_k, cache_v, lengths,
                                            CACHE_LAYOUT, (_TOKENS, CACHE_LAYOUT, CACHE_LAYOUT))
        return out.astype(q.dtype), cache_k, cache_v
    args = (q, k_new, v_new, new_valid, cache_k[layer], cache_v[layer], lengths)
    out = whole_cache_attention(*args) if whole_cache else cached_attention(*args, use_kernel=use_kernel)
    return out, cache_k, cache_v


def cached_attention(q, k_new, v_new, new_valid, cache_k, cache_v, lengths, *, chunk: int = CHUNK,
                     use_kernel: bool = True):
    """Attention of new tokens over the committed cache prefix and each other (causal).

    q: [B, T, H, Dh]; k_new, v_new: [B, T, K, Dh], token i of row b at position ``lengths[b] + i``; new_valid
    [B, T] bool (False: a padding token, never attended). cache_k, cache_v: [Bc, S, K, Dh] where Bc divides B:
    query row b reads cache row ``b // (B // Bc)`` (Bc == 1: one cache row shared by every query row; Bc == B:
    one each; between: groups of candidate rows per prompt); lengths: [Bc] committed slots. Returns [B, T, H, Dh] in
    q's dtype; a query that sees no key (none exists for valid queries) gets zeros.

    On CPUs where ``cpu_kernels`` run (and ``use_kernel``), the same semantics come from
    ``cpu_kernels.decode_attention``, also batch-invariant by construction (blocks of 8 keys, online softmax):
    ``_cached_attention_rows`` is then its plain-JAX twin, which every other backend runs. On a mesh either runs on
    each device's own rows and heads.
    """
    B, Bc, Dh = q.shape[0], cache_k.shape[0], q.shape[-1]
    if Bc < 1 or B % Bc:
        raise ValueError(f"cache has {Bc} rows for {B} query rows (expected a divisor of {B})")
    kernel = (cpu_kernels.decode_attention if use_kernel and _kernel_runs(Dh, q.dtype)
              else functools.partial(_cached_attention_rows, chunk=chunk))
    return _per_device(kernel, q, k_new, v_new, new_valid, cache_k, cache_v, lengths, _TOKENS, _TOKENS).astype(q.dtype)


def _cached_attention_rows(q, k_new, v_new, new_valid, cache_k, cache_v, lengths, *, chunk: int):
    """``cached_attention``'s plain-JAX computation, on the rows and heads it is given (one device's, on a mesh)."""
    B, T, H, Dh = q.shape
    Bc, S, K, _ = cache_k.shape
    shared = Bc == 1 and B > 1
    G = H // K
    scale = 1.0 / math.sqrt(Dh)
    qg = q.reshape(B, T, K, G, Dh)
    lengths = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), (Bc,))
    cache_rows = jnp.arange(B) // (B // Bc)  # the cache row each query row reads
    row_len = lengths[cache_rows]
    first = row_len // chunk  # [B] first frontier chunk
    q_pos = row_len[:, None] + jnp.arange(T, dtype=jnp.int32)  # [B, T]

    # Part B: the frontier chunks, assembled per row from the cache (below its length) and its own block.
    frontier = -(-(chunk - 1 + T) // chunk)
    idx = first[:, None] * chunk + jnp.arange(frontier * chunk, dtype=jnp.int32)  # [B, F] absolute slots
    rel = idx - row_len[:, None]
    from_block = (rel >= 0) & (rel < T)
    take_block = jnp.clip(rel, 0, T - 1)
    take_cache = jnp.clip(idx, 0, S - 1)

    def assemble(new, cached):
        mine = jnp.take_along_axis(new, take_block[:, :, None, None], axis=1)
        old = cached[cache_rows[:, None], take_cache]
        return jnp.where(from_block[:, :, None, None], mine, old)

    keys_b, values_b = assemble(k_new, cache_k), assemble(v_new, cache_v)
    key_ok = (idx < row_len[:, None]) | (from_block & jnp.take_along_axis(new_valid, take_block, axis=1))
    vis_b = (key_ok[:, None, :] & (idx[:, None, :] <= q_pos[:, :, None]))[:, None, None]  # [B, 1, 1, T, F]
    s_b = jnp.where(vis_b, _scores(qg, keys_b, False, scale, chunk), _MASKED)
    m_b = jnp.max(s_b, axis=-1)

    # Part A: whole committed chunks below each row's frontier, under a switch over power-of-two chunk counts.
    sizes = part_a_sizes(S, chunk)
    zeros_l = jnp.zeros((B, K, G, T), jnp.float32)
    zeros_acc = jnp.zeros((B, K, G, T, Dh), jnp.float32)

    def part_a(n: int):
        def run(m_b):
            if n == 0:
                return m_b, zeros_l, zeros_acc
            slots = jnp.arange(n * chunk, dtype=jnp.int32)
            vis = (slots[None, :] < first[:, None] * chunk)[:, None, None, None, :]  # [B, 1, 1, 1, n*chunk]
            s = jnp.where(vis, _scores(qg, cache_k[:, : n * chunk], shared, scale, chunk), _MASKED)
            m = jnp.maximum(m_b, jnp.max(s, axis=-1))
            p = jnp.where(vis, jnp.exp(s - m[..., None]), 0.0)
            sums, acc = _chunk_sums(p, cache_v[:, : n * chunk], shared, chunk)
            return (m,) + _fold(zeros_l, zeros_acc, sums, acc)
        return run

    if not shared and Bc != B:  # groups of query rows per cache row: this fallback reads a copy per query row
        cache_k, cache_v = cache_k[cache_rows], cache_v[cache_rows]
    need = jnp.max(first)
    branch = jnp.sum(jnp.asarray(sizes[1:], jnp.int32) < need) + jnp.where(need > 0, 1, 0)
    m, total_l, total_acc = jax.lax.switch(branch, [part_a(n) for n in sizes], m_b)

    p_b = jnp.where(vis_b, jnp.exp(s_b - m[..., None]), 0.0)
    sums, acc = _chunk_sums(p_b, values_b, False, chunk)
    total_l, total_acc = _fold(total_l, total_acc, sums, acc)
    out = total_acc / jnp.where(total_l > 0, total_l, 1.0)[..., None]  # [B, K, G, T, Dh]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh).astype(q.dtype)


def whole_cache_attention(q, k_new, v_new, new_valid, cache_k, cache_v, lengths):
    """The semantics of ``cached_attention`` computed by one program shape per forward shape: each query row's block
    is written into its own copy of its cache row at the committed length, and every query attends over all S
    slots in position order (slot s is visible to the query at position p iff s <= p and s holds a committed key
    or a valid key of the block).

    Fixed-shape decoding (``decoding.shapes``) uses it: when every decode forward of a run has one shape, a query's
    keys occupy the same slots whether earlier forwards committed them or its own block carries them, so each
    reduction sees the same operands in the same positions, with exact zeros where a slot is invisible, and a
    backend's kernels (chosen by shape) give the token the same bits in any method. It reads the whole cache every
    forward (no prefix-length switch), which costs little where the weights, not the cache, bound a step.
    Shapes as ``cached_attention``; requires ``lengths + T <= S``. On a mesh it runs on each device's own rows and
    heads, as ``cached_attention`` does.
    """
    B, Bc = q.shape[0], cache_k.shape[0]
    if Bc < 1 or B % Bc:
        raise ValueError(f"cache has {Bc} rows for {B} query rows (expected a divisor of {B})")
    return _per_device(_whole_cache_attention_rows, q, k_new, v_new, new_valid, cache_k, cache_v, lengths, _TOKENS,
                       _TOKENS)


def _whole_cache_attention_rows(q, k_new, v_new, new_valid, cache_k, cache_v, lengths):
    """``whole_cache_attention``'s computation, on the rows and heads it is given (one device's, on a mesh)."""
    B, T, H, Dh = q.shape
    Bc, S, K, _ = cache_k.shape
    G = H // K
    cache_rows = jnp.arange(B) // (B // Bc)
    row_len = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), (Bc,))[cache_rows]  # [B]

    def own_copy(cached, new, length):  # [S, K, Dh], [T, K, Dh]: the row's block written at its length
        return jax.lax.dynamic_update_slice(cached, new.astype(cached.dtype), (length, 0, 0))

    keys = jax.vmap(own_copy)(cache_k[cache_rows], k_new, row_len)  # [B, S, K, Dh]
    values = jax.vmap(own_copy)(cache_v[cache_rows], v_new, row_len)
    slots = jnp.arange(S, dtype=jnp.int32)
    rel = slots[None, :] - row_len[:, None]  # [B, S] slot's index in the block
    in_block = (rel >= 0) & (rel < T)
    key_ok = (rel < 0) | (in_block & jnp.take_along_axis(new_valid, jnp.clip(rel, 0, T - 1), axis=1))
    q_pos = row_len[:, None] + jnp.arange(T, dtype=jnp.int32)  # [B, T]
    visible = (key_ok[:, None, :] & (slots[None, None, :] <= q_pos[:, :, None]))[:, None, None]  # [B, 1, 1, T, S]
    scores = jnp.einsum("btkgd,bskd->bkgts", q.reshape(B, T, K, G, Dh), keys,
                        preferred_element_type=jnp.float32) * (1.0 / math.sqrt(Dh))
    scores = jnp.where(visible, scores, _MASKED)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.where(visible, jnp.exp(scores - m), 0.0)
    total = jnp.sum(p, axis=-1)
    acc = jnp.einsum("bkgts,bskd->bkgtd", p.astype(values.dtype), values, preferred_element_type=jnp.float32)
    out = acc / jnp.where(total > 0, total, 1.0)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh).astype(q.dtype)
