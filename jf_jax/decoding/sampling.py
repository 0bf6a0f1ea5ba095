"""How every decoder picks a token from float32 logits: greedy, or a sample that parallel decoding reproduces exactly.

A sample is the Gumbel-max trick with noise keyed by the *token*, not by the step that computes it::

    token(p) = argmax_v( filter(logits_p / T)_v + G(seed, prompt index, p)_v )

where ``p`` is the absolute position of the token being chosen, ``G`` is i.i.d. standard Gumbel noise over the
vocabulary drawn from ``fold_in(sampling_key(seed, prompt index), p)``, and ``filter`` keeps the top-k logits and
then the top-p nucleus (the rest become -inf). For a fixed prompt and seed this is a deterministic function of the
logits at ``p``, and ``argmax(l + G)`` is an exact sample from ``softmax(l)`` (Gumbel-max), so AR decoding with it
samples from the model's filtered distribution. Jacobi and multi-block decoding iterate the very same function of
each position's logits, so their fixed point is the AR sample sequence, whatever the draft: the greedy guarantee
carries over to sampling unchanged. The noise never depends on the iteration, the batch or a row's place in it.

The draft RNG (``common.prompt_key``) is a separate stream: the drafts only change how fast the fixed point is
reached, never which tokens it holds. ``temperature == 0`` is greedy decoding (``common.greedy``), bit for bit.

Filters, with ties decided by value so that the result never depends on a sort's order:

* top-k (``top_k > 0``): keep every token whose logit is >= the k-th largest logit (ties at the boundary kept);
* top-p (``top_p < 1``): over the temperature-scaled distribution (after top-k), keep every token whose *mass
  above* (the probability of the tokens strictly more likely than it, counted in whole units of 2**-30) is < p.
  Integer masses make the sums exact, so the cheap search among the most likely tokens and the full-vocabulary
  fallback agree bit for bit, and a row's nucleus never depends on the rows computed beside it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jf_jax.decoding.common import GenerationError, check_int, greedy

SAMPLING_STREAM = 0x7FFF_FFFF
"""fold_in tag that separates the sampling keys of a seed from its draft keys (``common.prompt_key`` folds in the
prompt index, which ``check_int`` keeps below ``MAX_PROMPTS``)."""
MAX_PROMPTS = 2**31 - 2


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Token choice settings (hashable: a static argument of the compiled decoders)."""

    temperature: float = 0.0
    """0: greedy (argmax); > 0: sample from softmax(logits / temperature) after the filters."""
    top_k: int = 0
    """Keep the k most likely tokens (ties at the k-th kept); 0: no top-k filter."""
    top_p: float = 1.0
    """Keep the nucleus of probability top_p (ties at the boundary kept); 1: no top-p filter."""

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
            raise GenerationError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        check_int("top_k", self.top_k, 0, 2**31 - 1)
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise GenerationError(f"top_p must be a number in (0, 1] (1 = off), got {p!r}")
        if t == 0 and (self.top_k or p < 1):
            raise GenerationError(f"top_k={self.top_k} / top_p={p} only apply when sampling: set a temperature > 0 "
                                  "(temperature 0 is greedy decoding)")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def describe(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


GREEDY = Sampling()


def sampling_key(seed: int, index: int):
    """The sampling key of prompt ``index`` of a request with ``seed`` (independent of the draft keys)."""
    root = jax.random.fold_in(jax.random.PRNGKey(check_int("seed", seed, 0, 2**31 - 1)), SAMPLING_STREAM)
    return jax.random.fold_in(root, check_int("prompt index", index, 0, MAX_PROMPTS))


MASS_UNITS = 2**30
"""Token probabilities are counted in whole units of 2**-30 (rounded down) when the top-p filter sums them: integer
sums are exact in any order, so every way of finding the nucleus below (and every batch shape) agrees bit for bit."""
NUCLEUS_CANDIDATES = 256
"""The top-p filter first looks for the nucleus among this many most likely tokens (a cheap ``lax.top_k``); when a
row's nucleus is larger, all rows fall back to a bisection over the whole vocabulary (same integers, same answer)."""


def filter_logits(scaled, top_k: int, top_p: float):
    """``scaled`` [..., V] float32 (logits / T) with the tokens the filters drop set to -inf (see module doc)."""
    V = scaled.shape[-1]
    neg = jnp.float32(-jnp.inf)
    if 0 < top_k < V:
        # min over the values, not ``[..., -1:]``: XLA:CPU turns top_k followed by that slice into a full sort
        # (~8 ms a row at V = 49k against ~0.1 ms)
        kth = jnp.min(jax.lax.top_k(scaled, top_k)[0], axis=-1, keepdims=True)
        scaled = jnp.where(scaled >= kth, scaled, neg)
    if top_p < 1.0:
        scaled = jnp.where(scaled >= nucleus_cutoff(scaled, top_p), scaled, neg)
    return scaled


def nucleus_cutoff(scaled, top_p: float):
    """The smallest logit [..., 1] whose mass above (the probability of the strictly larger logits, in whole
    ``MASS_UNITS``) is below ``top_p``: the top-p filter keeps the logits >= it. No full sort (XLA:CPU sorts 49k
    floats in ~11 ms)."""
    scaled = jnp.where(scaled == 0, jnp.float32(0), scaled)  # -0.0 -> +0.0: ties are by value, keys by bits
    mass = jnp.floor(jax.nn.softmax(scaled, axis=-1) * jnp.float32(MASS_UNITS)).astype(jnp.int32)
    limit = jnp.int32(math.ceil(top_p * MASS_UNITS))  # integer mass < top_p * units  <=>  mass < limit
    k = min(NUCLEUS_CANDIDATES, scaled.shape[-1])
    values, index = jax.lax.top_k(scaled, k)
    value_mass = jnp.take_along_axis(mass, index, axis=-1)
    above = jnp.cumsum(value_mass, axis=-1) - value_mass  # exact; the first of a tie has its value's mass above
    cutoff = jnp.min(jnp.where(above < limit, values, jnp.float32(jnp.inf)), axis=-1, keepdims=True)
    lowest = jnp.min(values, axis=-1, keepdims=True)
    # the candidates hold every logit > lowest: if that mass already reaches the limit, the nucleus ends above it
    found = jnp.sum(jnp.where(values > lowest, value_mass, 0), axis=-1) >= limit
    return jax.lax.cond(jnp.all(found), lambda: cutoff, lambda: _bisect_cutoff(scaled, mass, limit))


def _bisect_cutoff(scaled, mass, limit):
    """``nucleus_cutoff`` over the whole vocabulary: bisection on the logits' order-preserving uint32 keys (32 exact
    integer passes). The mass above a key only changes at logit keys, so the smallest key whose mass above is
    below ``limit`` is a logit's key."""
    bits = jax.lax.bitcast_convert_type(scaled, jnp.int32)
    bits = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFF_FFFF), bits)  # negative floats: reverse their order
    keys = jax.lax.bitcast_convert_type(bits, jnp.uint32) ^ jnp.uint32(0x8000_0000)

    def halve(_, bounds):  # invariant: mass above hi < limit; mass above lo >= limit (or lo is the start, 0)
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        small = jnp.sum(jnp.where(keys > mid, mass, 0), axis=-1, keepdims=True) < limit
        return jnp.where(small, lo, mid), jnp.where(small, mid, hi)

    hi = jnp.max(keys, axis=-1, keepdims=True)
    _, hi = jax.lax.fori_loop(0, 32, halve, (jnp.zeros_like(hi), hi))
    return jnp.min(jnp.where(keys >= hi, scaled, jnp.float32(jnp.inf)), axis=-1, keepdims=True)


def gumbel_noise(keys, positions, vocab: int):
    """Standard Gumbel noise [..., V] per (key [..., 2], position [...]) pair; positions.shape == keys.shape[:-1]."""
    flat_keys = keys.reshape(-1, keys.shape[-1])
    flat_pos = positions.reshape(-1).astype(jnp.uint32)
    noise = jax.vmap(lambda k, p: jax.random.gumbel(jax.random.fold_in(k, p), (vocab,), jnp.float32))(
        flat_keys, flat_pos)
    return noise.reshape(positions.shape + (vocab,))


def choose(sampling: Sampling, logits, positions, keys):
    """The token at each position: logits [..., V] (any float dtype; computed in float32), ``positions`` [...] the
    absolute positions of the tokens being chosen, ``keys`` [B, 2] the rows' sampling keys (leading axis of
    ``positions``). Greedy ignores positions and keys."""
    if sampling.is_greedy:
        return greedy(logits)
    logits = logits.astype(jnp.float32)
    scaled = filter_logits(logits / jnp.float32(sampling.temperature), sampling.top_k, sampling.top_p)
    row_keys = jnp.broadcast_to(keys.reshape(keys.shape[:1] + (1,) * (positions.ndim - 1) + keys.shape[1:]),
                                positions.shape + keys.shape[1:])
    return greedy(scaled + gumbel_noise(row_keys, positions, logits.shape[-1]))
