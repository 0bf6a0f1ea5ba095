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
* top-p (``top_p < 1``): over the temperature-scaled distribution (after top-k), keep every token whose logit is
  >= the smallest logit in the shortest prefix of the descending order whose exclusive cumulative probability is
  below ``top_p``, i.e. a token is kept when the probability of the tokens strictly more likely than it is < p.
"""

from __future__ import annotations

import dataclasses

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


def filter_logits(scaled, top_k: int, top_p: float):
    """``scaled`` [..., V] float32 (logits / T) with the tokens the filters drop set to -inf (see module doc)."""
    V = scaled.shape[-1]
    neg = jnp.float32(-jnp.inf)
    if 0 < top_k < V:
        kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
        scaled = jnp.where(scaled >= kth, scaled, neg)
    if top_p < 1.0:
        desc = -jnp.sort(-scaled, axis=-1)
        probs = jax.nn.softmax(desc, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability of the tokens ahead in the descending order
        inside = before < jnp.float32(top_p)  # a prefix (``before`` is non-decreasing); never empty
        cutoff = jnp.min(jnp.where(inside, desc, jnp.float32(jnp.inf)), axis=-1, keepdims=True)
        scaled = jnp.where(scaled >= cutoff, scaled, neg)
    return scaled


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
