"""The fixed shapes of a serving batch and the jitted programs that move one request in and out of it.

A server decodes B rows together in one loop state of a ``decoding.runner.BlockDecoder`` (AR, Jacobi or
multi-block). Every shape a program sees is fixed when the server starts (``Layout``), so the programs compile at
warm-up and never per request:

* the batch state: B rows, an output buffer and a KV cache sized for ``max_context`` tokens (prompt + output) plus
  the method's lookahead;
* the prefill of a newcomer: a *one-row* state from the decoder's own ``init``, at the smallest of a few prompt
  buckets (powers of two up to the context) that holds its prompt, so a 20-token prompt does not pay for a
  1024-token forward; one prefill program per bucket;
* ``insert_row``: the one-row state written into row ``slot`` of the batch state (the slot is traced: one program
  per bucket, the bucketed prompt being padded to the batch's width on the way).

Why a one-row prefill and a scatter rather than re-initialising the batch: the running rows keep their state
untouched (no recomputation, no copy of their caches) and the newcomer's prefill is exactly the program a solo
``generate`` runs for it (same row, same keys), so its first token and draft are the ones it gets alone. Its later
tokens are too, because every op of a decode forward is batch-invariant and each row's bookkeeping is its own
(``decoding.runner``); the capacities differ from a solo run's but attention reads only the chunks a row holds.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.api import run_shape
from jf_jax.decoding.ar import ARDecoder
from jf_jax.decoding.common import MIN_BUCKET, GenerationError, bucket, check_int, prompt_key
from jf_jax.decoding.jacobi import JacobiDecoder
from jf_jax.decoding.multiblock import MAX_NUM_BLOCKS, MAX_POOL_SIZE, MRDecoder
from jf_jax.decoding.runner import MAX_BLOCK_SIZE, BlockDecoder
from jf_jax.decoding.sampling import Sampling, sampling_key
from jf_jax.decoding.shapes import DecodeShape
from jf_jax.model.cached_attention import CHUNK
from jf_jax.model.config import ModelConfig
from jf_jax.model.weight_matmul import this_machine_dot_rows

SERVED_METHODS = ("ar", "jacobi", "mr")
MAX_ROWS = 256


@dataclasses.dataclass(frozen=True)
class ServedMethod:
    """One (method, block size) pair a server decodes with. Each pair has its own slots and programs: the decoders'
    loop states differ in structure between methods and in shape between block sizes, so rows of two pairs cannot
    share one batch state."""

    method: str
    block_size: int
    """Jacobi / mr block size; AR's is 1 (it decodes one token per forward)."""

    def __post_init__(self):
        if self.method not in SERVED_METHODS:
            raise GenerationError(f"method must be one of {', '.join(SERVED_METHODS)}, got {self.method!r}")
        check_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        if self.method == "ar" and self.block_size != 1:
            raise GenerationError(f"ar decodes one token per forward: its block size is 1, got {self.block_size}")

    @classmethod
    def of(cls, method: str, block_size: int) -> "ServedMethod":
        """The pair a method runs with ``block_size`` (AR ignores it)."""
        return cls(method, 1 if method == "ar" else block_size)

    def describe(self) -> str:
        return self.method if self.method == "ar" else f"{self.method}/{self.block_size}"


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """What one batch decodes with: a method and block size, B rows, the context. A server runs one batch per
    ``ServedMethod`` it serves (``for_method``); this one's method and block size are the server's default."""

    method: str = "jacobi"
    block_size: int = 8
    """Jacobi / mr block size n (AR: 1). 8: the CLI's default, the fastest on a 2-core CPU (docs/decoding.md)."""
    max_batch: int = 8
    max_context: int = 1024
    """Prompt plus generated tokens of one request (capped at the model's context)."""
    num_blocks: int = 2
    spawn_ratio: float = 0.85
    pool_size: int = 4
    decode_shape: str = "auto"
    """``api.run_shape``'s choice: padded forwards on GPUs and TPUs, natural shapes on the CPU."""
    min_prompt_bucket: int = MIN_BUCKET
    """The narrowest prefill; fewer buckets compile sooner, more waste less on short prompts."""

    def __post_init__(self):
        ServedMethod.of(self.method, self.block_size)  # checks both
        check_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)  # AR's too: it is the others' default
        check_int("max_batch", self.max_batch, 1, MAX_ROWS)
        check_int("max_context", self.max_context, 2, 2**20)
        check_int("num_blocks", self.num_blocks, 1, MAX_NUM_BLOCKS)
        check_int("pool_size", self.pool_size, 1, MAX_POOL_SIZE)
        check_int("min_prompt_bucket", self.min_prompt_bucket, 1, 2**20)
        if isinstance(self.spawn_ratio, bool) or not 0 < self.spawn_ratio <= 1:
            raise GenerationError(f"spawn_ratio must be a number in (0, 1], got {self.spawn_ratio!r}")

    @property
    def block(self) -> int:
        """The block size the decoder runs (AR decodes one token per forward whatever ``block_size`` says)."""
        return 1 if self.method == "ar" else self.block_size

    @property
    def served_method(self) -> ServedMethod:
        return ServedMethod.of(self.method, self.block_size)

    def for_method(self, pair: ServedMethod) -> "BatchConfig":
        """This configuration decoding with ``pair`` (the other options are shared by every pair of a server)."""
        return dataclasses.replace(self, method=pair.method, block_size=pair.block_size)

    def run_options(self) -> dict:
        """The options ``api.generate`` would take for this method (for ``api.run_shape``)."""
        if self.method == "ar":
            return {}
        if self.method == "jacobi":
            return dict(block_size=self.block_size)
        return dict(block_size=self.block_size, num_blocks=self.num_blocks, pool_size=self.pool_size)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every shape of a server's programs."""

    rows: int
    max_context: int
    prompt_buckets: tuple[int, ...]
    """Prefill widths, ascending; a prompt is padded to the first that holds it."""
    out_capacity: int
    cache_capacity: int
    shape: DecodeShape | None

    @property
    def prompt_width(self) -> int:
        return self.prompt_buckets[-1]

    def bucket_for(self, prompt_len: int) -> int:
        return next(b for b in self.prompt_buckets if b >= prompt_len)


def plan_layout(cfg: ModelConfig, batch: BatchConfig, backend: str | None = None) -> Layout:
    """The shapes of a server decoding ``batch`` with a model of config ``cfg``."""
    context = min(batch.max_context, cfg.max_position_embeddings)
    shape = run_shape(batch.decode_shape, [(batch.method, batch.run_options())], backend)
    natural = {"ar": 1, "jacobi": batch.block_size, "mr": batch.block_size * batch.num_blocks}[batch.method]
    # KV slots a forward may write past the last committed one; short forwards are padded to ``fewest`` rows
    # (``decoding.common.prepare_prompts`` sizes solo runs the same way)
    lookahead = max(natural if shape is None else shape.width, this_machine_dot_rows(cfg.dtype).fewest)
    top = bucket(context - 1)  # the longest prompt leaves room for one token
    buckets, width = [], min(batch.min_prompt_bucket, top)
    while width < top:
        buckets.append(width)
        width *= 2
    # the prefill writes its whole bucket (plus a block of guesses); decoding writes up to the context + lookahead
    capacity = -(-(max(context, top) + lookahead) // CHUNK) * CHUNK
    return Layout(rows=batch.max_batch, max_context=context, prompt_buckets=(*buckets, top), out_capacity=context,
                  cache_capacity=capacity, shape=shape)


def make_decoder(cfg: ModelConfig, batch: BatchConfig, sampling: Sampling, shape: DecodeShape | None) -> BlockDecoder:
    """The decoder ``api.generate`` builds for this method, options and sampling (one per sampling setting)."""
    if batch.method == "ar":
        return ARDecoder(cfg, 1, sampling=sampling, shape=shape)
    if batch.method == "jacobi":
        return JacobiDecoder(cfg, batch.block_size, sampling=sampling, shape=shape)
    threshold = max(1, math.ceil(batch.spawn_ratio * batch.block_size - 1e-9))  # as ``generate_mr``
    return MRDecoder(cfg, batch.block_size, batch.num_blocks, threshold, batch.pool_size, sampling=sampling,
                     shape=shape)


def prefill_row(decoder: BlockDecoder, params, layout: Layout, prompt: list[int], max_new: int, eos_ids: np.ndarray,
                seed: int):
    """The one-row loop state of a request, with the keys it gets decoded alone (prompt index 0 of a call with
    ``seed``): ``common.prompt_key`` for drafts, ``sampling.sampling_key`` for samples."""
    tokens = np.zeros((1, layout.bucket_for(len(prompt))), np.int32)
    tokens[0, : len(prompt)] = prompt
    keys = prompt_key(seed, 0)[None]
    sample_keys = sampling_key(seed, 0)[None]
    return decoder.init(params, jnp.asarray(tokens), jnp.asarray([len(prompt)], jnp.int32), keys, sample_keys,
                        jnp.int32(max_new), eos_ids, layout.out_capacity, layout.cache_capacity)


def _fit(row, like):
    """One row's leaf [1, ...] padded with zeros to the trailing shape of the batch leaf ``like`` [B, ...] (only the
    bucketed prompt differs: reads past a row's prompt length never reach the padding)."""
    pad = [(0, 0)] + [(0, t - s) for s, t in zip(row.shape[1:], like.shape[1:])]
    return jnp.pad(row, pad).astype(like.dtype)


def _insert(state, row, slot):
    rows = jax.tree.map(lambda big, one: big.at[slot].set(_fit(one, big)[0]),
                        dataclasses.replace(state, cache=None), dataclasses.replace(row, cache=None))
    c, r = state.cache, row.cache
    cache = dataclasses.replace(c, k=jax.lax.dynamic_update_slice_in_dim(c.k, r.k, slot, axis=1),
                                v=jax.lax.dynamic_update_slice_in_dim(c.v, r.v, slot, axis=1),
                                lengths=c.lengths.at[slot].set(r.lengths[0]))
    return dataclasses.replace(rows, cache=cache)


# the batch state is donated: XLA writes the row in place instead of copying every row's cache
_insert_donated = jax.jit(_insert, donate_argnums=0)


def insert_row(state, row, slot: int):
    """``state`` with row ``slot`` replaced by the one-row state ``row`` (``state`` is consumed)."""
    return _insert_donated(state, row, jnp.int32(slot))


@jax.jit
def _finish(done, slot):
    return done.at[slot].set(True)


def finish_row(state, slot: int):
    """``state`` with row ``slot`` marked done: the decoders keep a done row's state and commit none of its writes."""
    return dataclasses.replace(state, done=_finish(state.done, jnp.int32(slot)))


def empty_batch(row, layout: Layout):
    """A batch state of ``layout.rows`` rows, every one a done copy of the one-row state ``row``."""
    rows = jax.tree.map(lambda x: jnp.repeat(x, layout.rows, axis=0), dataclasses.replace(row, cache=None))
    if hasattr(rows, "prompt"):  # Jacobi / mr keep the bucketed prompt (drafts draw from it): the widest bucket
        width = layout.prompt_width - rows.prompt.shape[1]
        rows = dataclasses.replace(rows, prompt=jnp.pad(rows.prompt, ((0, 0), (0, width))))
    c = row.cache
    cache = dataclasses.replace(c, k=jnp.repeat(c.k, layout.rows, axis=1), v=jnp.repeat(c.v, layout.rows, axis=1),
                                lengths=jnp.repeat(c.lengths, layout.rows, axis=0))
    return with_done(dataclasses.replace(rows, cache=cache), np.ones((layout.rows,), bool))


def place_state(mesh, state):
    """The batch state on ``mesh`` (unchanged without one): every array of one entry per row split by rows over
    the batch axes, the KV cache [L, B, S, K, Dh] by rows and by KV heads over ``tensor`` (as the weights that
    write it are split), anything else whole on every device. The steps keep these placements, so the programs
    compiled at warm-up are the ones every request meets."""
    if mesh is None:
        return state
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jf_jax.model.sharding import BATCH_AXES

    B = state.count.shape[0]
    heads = "tensor" if state.cache.k.shape[3] % mesh.shape["tensor"] == 0 else None
    by_rows = lambda x: NamedSharding(mesh, P(BATCH_AXES) if x.ndim and x.shape[0] == B else P())  # noqa: E731
    placed = jax.tree.map(lambda x: jax.device_put(x, by_rows(x)), dataclasses.replace(state, cache=None))
    cache = NamedSharding(mesh, P(None, BATCH_AXES, None, heads, None))
    return dataclasses.replace(placed, cache=dataclasses.replace(
        state.cache, k=jax.device_put(state.cache.k, cache), v=jax.device_put(state.cache.v, cache),
        lengths=jax.device_put(state.cache.lengths, by_rows(state.cache.lengths))))


def with_done(state, done: np.ndarray):
    """``state`` with its ``done`` flags replaced (how one lane's step leaves the other lanes' rows alone). The new
    array is *committed* to the state's device like every output of a jitted program: JAX keys its compiled programs
    on that too, and an uncommitted argument would compile the step again."""
    return dataclasses.replace(state, done=jax.device_put(np.asarray(done, bool), state.count.sharding))


def read_rows(state):
    """Host copies of what the scheduler reads after a step: out [B, N], count [B], done [B], stop [B], forwards [B]."""
    return jax.device_get((state.out, state.count, state.done, state.stop, state.forwards))
