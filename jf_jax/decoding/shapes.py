"""Fixed-shape decoding: every decode forward of a run has one shape, so on GPUs and TPUs the same compiled kernels
compute every token, and Jacobi / multi-block tokens equal AR's (token equality measured on H100s and an H200; no TPU
has run it: docs/gpu-tpu.md, "Lossless on a GPU").

Why shapes matter off the CPU: a GPU's matmul library picks its algorithm (tile shape, split of the reduction,
a matrix-vector kernel for one row) from the problem's shape, and each choice sums a dot product in its own order.
A token verified inside a 16-token Jacobi block and the same token in a one-token AR step then get logits that
differ in the last bits, and in bfloat16 a near-tie of two logits flips the argmax: the outputs part ways. On the
CPU the decode path is invariant by construction (``model.cached_attention``, ``model.weight_matmul``), so
nothing is padded there by default.

With a ``DecodeShape(rows=R, width=W)`` every method of a run pads every decode forward to R token rows of W
tokens per prompt (padding tokens are invalid: they neither attend nor are attended), its prefill to the prompt
bucket plus W tokens with the next-token logits of W positions, and sizes its KV cache the same way; attention
reads the whole cache in position order (``cached_attention.whole_cache_attention``), so a query's keys sit in the
same slots whichever forward computed them. AR, Jacobi at n <= W and multi-block decoding with K * n <= W and
``pool_size`` <= R then run one program shape, and a token's arithmetic does not depend on the method. On a GPU a
padded step costs what an unpadded one does while the forward is bound by reading the weights (up to ~128
tokens for the models this targets); on a CPU it costs in proportion to R * W, so it is off there unless asked for.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.sampling import Sampling, choose
from jf_jax.model.config import ModelConfig
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.transformer import forward_shared_prefix, logits

PADDED_BACKENDS = ("gpu", "cuda", "rocm", "tpu")
"""Backends whose decode forwards are padded to one shape by default (``default_decode_shape``)."""


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """The shape every decode forward of a run is padded to: ``rows`` token rows of ``width`` tokens per prompt."""

    rows: int
    width: int

    def __post_init__(self):
        for name in ("rows", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GenerationError(f"DecodeShape.{name} must be a positive integer, got {value!r}")

    def check_covers(self, method: str, rows: int, width: int) -> None:
        """A GenerationError unless a method forwarding ``rows`` x ``width`` tokens per prompt fits this shape."""
        if rows > self.rows or width > self.width:
            raise GenerationError(f"{method} forwards {rows} row(s) of {width} tokens per prompt, more than the fixed "
                                  f"decode shape {self.rows}x{self.width}; choose a shape that covers every method")

    def __str__(self) -> str:
        return f"{self.rows}x{self.width}"  # what ``parse`` reads

    @classmethod
    def parse(cls, text: str) -> "DecodeShape":
        """``"RxW"`` (e.g. ``4x32``) as a shape."""
        try:
            rows, width = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise GenerationError(f"a decode shape is ROWSxWIDTH (e.g. 4x32), got {text!r}") from None
        return cls(rows, width)


def shape_label(shape: DecodeShape | None) -> str | None:
    """How reports record a run's decode shape: "RxW", or None when every forward had its natural shape."""
    return None if shape is None else str(shape)


def natural_shape(method: str, block_size: int = 1, num_blocks: int = 1, pool_size: int = 1) -> DecodeShape:
    """The rows and width one method's decode forwards have unpadded: AR 1 x 1, Jacobi 1 x n, multi-block with
    recycling ``pool_size`` x (``num_blocks`` * n)."""
    if method == "ar":
        return DecodeShape(1, 1)
    if method == "jacobi":
        return DecodeShape(1, block_size)
    if method == "mr":
        return DecodeShape(pool_size, block_size * num_blocks)
    raise GenerationError(f"unknown decoding method {method!r}")


def covering(shapes) -> DecodeShape:
    """The smallest shape every one of ``shapes`` fits in."""
    shapes = list(shapes)
    return DecodeShape(max(s.rows for s in shapes), max(s.width for s in shapes))


def default_decode_shape(shapes, backend: str | None = None) -> DecodeShape | None:
    """The shape a run of methods with these natural ``shapes`` pads to on ``backend`` (default: JAX's): their
    covering shape on ``PADDED_BACKENDS``, None (every forward at its natural shape) on the CPU."""
    backend = jax.default_backend() if backend is None else backend
    return covering(shapes) if backend in PADDED_BACKENDS else None


def fixed_forward(params, cfg: ModelConfig, shape: DecodeShape, tokens, valid, cache: KVCache, sampling: Sampling,
                  sample_keys):
    """One decode forward of ``tokens`` [B, R', W'] (``valid`` marks real tokens) padded to ``shape``: R rows of W
    tokens per prompt over the prompt's cache row (read, not written), attention over the whole cache.

    Returns the predictions [B, R', W'] (the token chosen after each, with each prompt's ``sample_keys`` [B, 2]) and
    the new keys and values [L, B, R', W', K, Dh]; the caller writes the rows it keeps.
    """
    B, rows, width = tokens.shape
    R, W = shape.rows, shape.width
    pad = ((0, 0), (0, R - rows), (0, W - width))
    flat_tokens = jnp.pad(tokens, pad).reshape(B * R, W)
    flat_valid = jnp.pad(valid, pad).reshape(B * R, W)
    hidden, new_k, new_v, _ = forward_shared_prefix(params, cfg, flat_tokens, cache, valid=flat_valid,
                                                    whole_cache=True)
    positions = jnp.repeat(cache.lengths, R)[:, None] + jnp.arange(W)
    g = choose(sampling, logits(params, cfg, hidden), positions + 1, jnp.repeat(sample_keys, R, axis=0))
    kv = lambda x: x.reshape((x.shape[0], B, R, W) + x.shape[3:])[:, :, :rows, :width]  # noqa: E731
    return g.reshape(B, R, W)[:, :rows, :width], kv(new_k), kv(new_v)

