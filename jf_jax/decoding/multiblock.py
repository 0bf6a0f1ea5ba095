"""Multi-block Jacobi decoding with rejection recycling, method "mr" (docs/method.md, section 6, decisions 6-7).

Up to K blocks of n tokens are in flight in one row of width K*n at consecutive positions after the committed
cache: the real-active (RA) block's remaining draft, then the pseudo-active (PA) blocks, each a full n-token
Jacobi iterate conditioned on the (unverified) tokens before it. One forward (plus recycled candidate rows,
see ``jf_jax.decoding.recycling``) updates everything at once:

* the RA's longest verified prefix is committed (KV kept by moving the cache length), capped at the RA's end,
  at EOS and at ``max_new_tokens`` exactly as in ``jf_jax.decoding.jacobi``;
* every in-flight position takes the prediction made at the position before it (the Jacobi update), so the
  new row is the predictions shifted past the accepted tokens: the RA draft becomes
  ``[correction] ++ predictions`` and the PA blocks are refined in the same pass;
* a PA block's progress is the leading run of its tokens that agreed with the model in this forward;
* spawn: when fewer than K blocks are in flight and the newest block has at least ``ceil(r*n)`` accepted
  (RA) or agreeing (PA) tokens, a block ``[prediction for its first position] ++ (n-1) context draws`` is
  appended;
* promotion: when the RA completes, the first PA block becomes the RA with its refined content (its first
  token is then the RA's bonus token) and is re-verified from scratch by the next forward: its work is carried
  over (REF discards it). With no PA block, the next RA is ``[bonus] ++ (n-1) context draws``.

Only the RA's verified tokens are ever emitted, so the output equals AR decoding (greedy, or sampled with the same
``decoding.sampling`` settings and seed: every prediction is the same function of its position's logits).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jf_jax.decoding.blocks import (block_key, cap_accepted, context_ids, draw_context, emit, first_stop,
                                    leading_matches, start_blocks, step_stop)
from jf_jax.decoding.common import GenerationError, GenerationResult, check_int, eos_array, is_eos, prepare_prompts
from jf_jax.decoding.recycling import build_candidates, forward_rows, harvest, pick_winner, push
from jf_jax.decoding.sampling import GREEDY, Sampling
from jf_jax.decoding.shapes import DecodeShape, fixed_forward
from jf_jax.decoding.runner import MAX_BLOCK_SIZE, BlockDecoder, OnTokens, decode_prompts, keep_if_done, per_row
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import decode_jit
from jf_jax.model.decode_view import DecodeView
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import Params

MAX_NUM_BLOCKS = 8
MAX_POOL_SIZE = 16
MR_COUNTERS = ("recycling_rounds", "recycling_wins", "spawns", "promotions", "promotions_carried")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MRState:
    """Loop state of B prompts decoded together; every field is an array with a leading [B] row axis (the
    shapes below are one row's), except the cache, which holds B rows."""

    row: jax.Array  # [K*n] in-flight tokens: RA draft (ra_len) then n_pa PA blocks of n; valid up to row_len
    row_len: jax.Array  # []
    ra_len: jax.Array  # [] RA draft length (n - tokens accepted in the RA block)
    n_pa: jax.Array  # [] pseudo-active blocks in flight
    pa_progress: jax.Array  # [K] progress of PA block b at index b (index 0 unused)
    out: jax.Array  # [N] generated ids, -1 past count
    count: jax.Array  # []
    block_start: jax.Array  # [] count at the start of the RA block
    done: jax.Array  # [] (or a padding row of the batch)
    cache: KVCache | None  # B rows; lengths == prompt_len + count (None in a one-row view)
    prompt: jax.Array  # [P]
    prompt_len: jax.Array  # []
    key: jax.Array  # [2] the prompt's draft key: a block's draft is drawn with ``blocks.block_key(key, its start)``
    sample_key: jax.Array  # [2] sampling key (``decoding.sampling``), fixed for the prompt
    max_new: jax.Array  # []
    eos_ids: jax.Array  # [8]
    pool: jax.Array  # [pool_size, n + K*n] recycled n-grams
    pool_len: jax.Array  # [pool_size] (0 = empty)
    pool_next: jax.Array  # [] ring slot of the next entry
    forwards: jax.Array  # [] prefill included
    block: jax.Array  # [] index of the RA block
    block_iters: jax.Array  # [max_blocks]
    accept_hist: jax.Array  # [n + 1]
    counters: jax.Array  # [len(MR_COUNTERS)]
    stop: jax.Array  # [] a StopReason value


@dataclasses.dataclass(frozen=True)
class MRDecoder(BlockDecoder):
    """Static half of multi-block decoding with recycling (hashable; a jit static arg). Drivers
    (``run_compiled``, ``run_python``) come from ``BlockDecoder``."""

    num_blocks: int
    spawn_threshold: int
    pool_size: int

    @property
    def width(self) -> int:
        return self.block_size * self.num_blocks

    def init(self, params: Params, prompts, prompt_lens, keys, sample_keys, max_new, eos_ids, out_capacity: int,
             capacity: int) -> MRState:
        b = start_blocks(params, self.cfg, self.block_size, self.sampling, prompts, prompt_lens, keys, sample_keys,
                         eos_ids, out_capacity, capacity, self.prefill_width)
        # the cache joins the state outside the state's program, which would otherwise copy it
        state = self._first_state(b._replace(cache=None), prompts, prompt_lens, max_new, eos_ids)
        return dataclasses.replace(state, cache=b.cache)

    @decode_jit(static_argnums=0)
    def _first_state(self, b, prompts, prompt_lens, max_new, eos_ids) -> MRState:
        n, W, S = self.block_size, self.width, self.pool_size
        rows = functools.partial(per_row, batch=prompts.shape[0])
        return MRState(
            row=jnp.pad(b.first, ((0, 0), (0, W - n))), row_len=rows(n), ra_len=rows(n), n_pa=rows(0),
            pa_progress=rows(jnp.zeros((self.num_blocks,))), out=b.out, count=b.first_eos.astype(jnp.int32),
            block_start=rows(0), done=b.first_eos, cache=b.cache, prompt=prompts, prompt_len=prompt_lens,
            key=b.key, sample_key=b.sample_key, max_new=rows(max_new), eos_ids=rows(eos_ids),
            pool=rows(jnp.zeros((S, n + W))),
            pool_len=rows(jnp.zeros((S,))), pool_next=rows(0), forwards=rows(1), block=rows(0),
            block_iters=b.block_iters, accept_hist=b.accept_hist, counters=rows(jnp.zeros((len(MR_COUNTERS),))),
            stop=first_stop(b.first_eos))

    def _verify(self, params: Params, s: MRState, rows):
        """One forward of ``rows`` [B, R, W] (R rows per prompt, sharing its cache row); returns per prompt the
        winning row [B, W], its predictions, its new KV [L, B, W, K, Dh], its index [B], and the cache to write
        the winner's KV into (``forward_rows``)."""
        B, R, W = rows.shape
        if self.shape is None:
            valid = jnp.repeat(jnp.arange(W) < s.row_len[:, None], R, axis=0)
            g, k, v, cache = forward_rows(params, self.cfg, rows.reshape(B * R, W), valid, s.cache, self.sampling,
                                          jnp.repeat(s.sample_key, R, axis=0))
        else:  # padded to the run's fixed decode shape
            valid = jnp.broadcast_to((jnp.arange(W) < s.row_len[:, None])[:, None], (B, R, W))
            g, k, v = fixed_forward(params, self.cfg, self.shape, rows, valid, s.cache, self.sampling, s.sample_key)
            cache = s.cache
        g = g.reshape(B, R, W)
        win = jax.vmap(pick_winner)(rows, g, s.row_len, s.ra_len)
        b = jnp.arange(B)
        pick = lambda x: x.reshape((x.shape[0], B, R) + x.shape[-3:])[:, b, win]  # noqa: E731
        return rows[b, win], g[b, win], pick(k), pick(v), win, cache

    def _step(self, params: Params, s: MRState) -> MRState:
        one = lambda _: self._verify(params, s, s.row[:, None])  # noqa: E731
        if self.pool_size > 1:
            cands, found = jax.vmap(functools.partial(build_candidates, num=self.pool_size - 1))(
                s.pool, s.pool_len, s.pool_next, s.row, s.ra_len)
            many = lambda _: self._verify(params, s, jnp.concatenate([s.row[:, None], cands], axis=1))  # noqa: E731
            recycled = found.any(axis=-1)
            if self.shape is None:
                d, g, k_new, v_new, win, cache = jax.lax.cond(jnp.any(recycled & ~s.done), many, one, None)
            else:  # one program shape: rows without a candidate repeat the draft, which wins their ties
                d, g, k_new, v_new, win, cache = many(None)
        else:
            recycled = jnp.zeros_like(s.done)
            d, g, k_new, v_new, win, cache = one(None)
        rows, accepted = jax.vmap(self._advance)(dataclasses.replace(s, cache=None), d, g, win, recycled)
        return dataclasses.replace(rows, cache=cache.write(k_new, v_new).commit(accepted))

    def _advance(self, s: MRState, d, g, win, recycled):
        """One row's bookkeeping after the forward: ``d`` [W] is the verified row (the winner), ``g`` its
        predictions. Returns the row's new state (unchanged once done) and how many written KV slots to commit."""
        n, K, W = self.block_size, self.num_blocks, self.width
        j = jnp.arange(W)
        ok, run = leading_matches(d, g, s.row_len)
        accepted, hit_eos = cap_accepted(d, jnp.minimum(1 + run, s.ra_len), s.count, s.max_new, s.eos_ids)
        out = emit(s.out, s.count, d, accepted)
        count = s.count + accepted
        done = hit_eos | (count >= s.max_new)

        # The Jacobi update of every in-flight position: predictions shifted past the accepted tokens.
        shifted = jnp.take(g, jnp.clip(accepted - 1 + j, 0, W - 1))
        extra = shifted[0]  # RA correction token, or its bonus token on completion
        extra_eos = ~done & is_eos(extra, s.eos_ids)
        out = jnp.where(extra_eos, emit(out, count, shifted, 1), out)
        count = count + extra_eos
        stop = s.stop + step_stop(s.done, hit_eos, extra_eos, accepted == s.ra_len, count, s.max_new)
        done = done | extra_eos
        full = (accepted == s.ra_len) & ~done

        ok_padded = jnp.pad(ok, (0, n))
        progress = [jnp.int32(0)]
        for b in range(1, K):
            seg = jax.lax.dynamic_slice_in_dim(ok_padded, s.ra_len + (b - 1) * n, n)
            progress.append(jnp.where(b <= s.n_pa, jnp.sum(jnp.cumprod(seg.astype(jnp.int32))), 0))
        progress = jnp.stack(progress)

        promote = full & (s.n_pa > 0)
        carried = promote & (progress[1 % K] > 0)
        n_pa = s.n_pa - promote
        progress = jnp.where(promote, jnp.roll(progress, -1).at[0].set(0), progress)
        ra_len = jnp.where(full, n, s.ra_len - accepted)
        new_len = s.row_len - accepted  # shifted[new_len] is the prediction for the first position past the row
        newest = jnp.where(n_pa == 0, n - ra_len, progress[n_pa])
        need = full & (s.n_pa == 0)
        spawn = ~done & ~need & (1 + n_pa < K) & (newest >= self.spawn_threshold)
        append = ~done & (need | spawn)
        if n > 1:  # the appended block starts at output position count + new_len: its draft key (blocks.block_key)
            tail = draw_context(block_key(s.key, count + new_len), s.prompt, s.prompt_len, out, count, n - 1)
            fill = append & (j > new_len) & (j < new_len + n)
            shifted = jnp.where(fill, jnp.take(tail, jnp.clip(j - new_len - 1, 0, n - 2)), shifted)
        row_len = new_len + n * append
        n_pa = n_pa + spawn
        progress = jnp.where(spawn, progress.at[n_pa].set(0), progress)

        pool, pool_len, pool_next = s.pool, s.pool_len, s.pool_next
        if self.pool_size > 1:
            context = functools.partial(context_ids, s.prompt, s.prompt_len, out)
            rejected = ~done & ~full
            for entry, length in harvest(context, s.prompt_len + count, d, g, accepted, s.row_len, n,
                                         pool.shape[1]):
                pool, pool_len, pool_next = push(pool, pool_len, pool_next, entry, length, rejected)

        counters = s.counters + jnp.stack([recycled, win > 0, spawn, promote, carried]).astype(jnp.int32)
        new = dataclasses.replace(
            s, row=shifted, row_len=row_len, ra_len=ra_len, n_pa=n_pa, pa_progress=progress, out=out, count=count,
            block_start=jnp.where(full, count, s.block_start), done=done,
            pool=pool, pool_len=pool_len, pool_next=pool_next,
            forwards=s.forwards + 1, block=s.block + full, block_iters=s.block_iters.at[s.block].add(1, mode="drop"),
            accept_hist=s.accept_hist.at[accepted].add(1), counters=counters, stop=stop)
        return keep_if_done(s, new), jnp.where(s.done, 0, accepted)

    def counters(self, host_row: MRState) -> dict[str, int]:
        return {name: int(c) for name, c in zip(MR_COUNTERS, host_row.counters)}


def generate_mr(params: Params | DecodeView, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                eos_ids: Sequence[int], block_size: int = 64, num_blocks: int = 2, spawn_ratio: float = 0.85,
                pool_size: int = 4, seed: int = 0, batch_size: int = 1, warmup: bool = True, driver: str = "compiled",
                on_tokens: OnTokens | None = None, on_step: Callable[[int, MRState, MRState], None] | None = None,
                sampling: Sampling = GREEDY, first_index: int = 0,
                decode_shape: DecodeShape | None = None, mesh=None) -> GenerationResult:
    """Multi-block Jacobi decoding with rejection recycling ("mr"), ``batch_size`` prompts at a time on bucketed
    shapes (with recycling, a forward verifies ``pool_size`` rows per prompt whenever any prompt has candidates).
    ``pool_size`` is the verification size: up to ``pool_size - 1`` recycled candidates are verified beside the
    draft (1 disables recycling); ``num_blocks=1`` disables multi-block. Drivers, streaming, observing and
    ``sampling``, ``decode_shape`` and ``mesh`` as ``generate_jacobi``."""
    n = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    num_blocks = check_int("num_blocks", num_blocks, 1, MAX_NUM_BLOCKS)
    pool_size = check_int("pool_size", pool_size, 1, MAX_POOL_SIZE)
    if isinstance(spawn_ratio, bool) or not isinstance(spawn_ratio, (int, float)) or not 0 < spawn_ratio <= 1:
        raise GenerationError(f"spawn_ratio must be a number in (0, 1], got {spawn_ratio!r}")
    if decode_shape is not None:
        decode_shape.check_covers("mr", pool_size, n * num_blocks)
    prep = prepare_prompts(cfg, prompts, max_new_tokens,
                           lookahead=n * num_blocks if decode_shape is None else decode_shape.width)
    decoder = MRDecoder(cfg, n, num_blocks, max(1, math.ceil(spawn_ratio * n - 1e-9)), pool_size, sampling=sampling,
                        shape=decode_shape)
    settings = dict(method="mr", num_blocks=num_blocks, spawn_ratio=float(spawn_ratio),
                    spawn_threshold=decoder.spawn_threshold, pool_size=pool_size)
    return decode_prompts(decoder, params, prep, eos_array(eos_ids), seed=seed, batch_size=batch_size,
                          driver=driver, warmup=warmup, on_tokens=on_tokens, on_step=on_step, settings=settings,
                          first_index=first_index, mesh=mesh)
