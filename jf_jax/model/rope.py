"""Rotary position embeddings: the frequencies of every ``rope_scaling`` type we support, and the tables.

The inverse frequencies are a function of the config alone, so they are computed once on the host (float64, then
float32, as transformers' float32 computation rounds them) and enter the compiled programs as constants. Each
type follows transformers' ``modeling_rope_utils`` for the same config fields:

* ``default``: ``1 / theta^(2i / Dh)``;
* ``linear``: default / factor (position interpolation);
* ``dynamic``: NTK-aware scaling that transformers recomputes only once a sequence outgrows
  ``max_position_embeddings``; jf-jax refuses such sequences, so inside the context it is exactly the default;
* ``llama3``: Llama 3.1's band-wise rescaling (wavelengths above ``original / low_freq_factor`` divided by factor,
  below ``original / high_freq_factor`` kept, a smooth ramp between);
* ``yarn``: interpolated and extrapolated frequencies mixed by a linear ramp over the correction range of
  ``beta_fast`` / ``beta_slow`` rotations, and cos / sin scaled by the attention factor
  (``0.1 ln(factor) + 1`` unless given).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jf_jax.model.config import ModelConfig, RopeScaling


def _default(head_dim: int, theta: float) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor
                                                                                   - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(head_dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoids a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = _default(head_dim, theta)
    interpolation = extrapolation / s.factor
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    return interpolation * (1 - keep) + extrapolation * keep


def attention_factor(scaling: RopeScaling | None) -> float:
    """The factor cos and sin are multiplied by (yarn's "mscale"; 1 for every other type)."""
    if scaling is None or scaling.rope_type != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    return 1.0 if scaling.factor <= 1 else 0.1 * math.log(scaling.factor) + 1.0


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """float32 [head_dim / 2] inverse frequencies of ``cfg``'s rotary embedding."""
    s = cfg.rope_scaling
    kind = "default" if s is None else s.rope_type
    if kind == "yarn":
        inv = _yarn(cfg.head_dim, cfg.rope_theta, s)
    else:
        inv = _default(cfg.head_dim, cfg.rope_theta)
        if kind == "linear":
            inv = inv / s.factor
        elif kind == "llama3":
            inv = _llama3(inv.astype(np.float32).astype(np.float64), s)
    return inv.astype(np.float32)


def rope_tables(positions, cfg: ModelConfig, *, unfused: bool = False):
    """cos, sin tables [B, T, 1, Dh/2] of the rotary embedding, computed once per forward.

    Angles are computed in float32: in bfloat16, positions past a few hundred lose the precision to
    distinguish neighbouring tokens.

    ``unfused``: make the tables arrays of their own (``_unfused``) rather than leave XLA to fuse them into their
    users. XLA:CPU counts cosine and sine as cheap elementwise operations and fuses them into every consumer: in
    the decode layout (a Python loop over layers) each layer's rotation of q and of k recomputed both tables for
    every head and lane of its output, 60 fusions per forward on a 30-layer model, each computing (heads x Dh)
    transcendentals per token, a cost that grows with the tokens of a Jacobi block.
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_frequencies(cfg))  # [B, T, Dh/2]
    scale = attention_factor(cfg.rope_scaling)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if scale != 1.0:
        cos, sin = cos * jnp.float32(scale), sin * jnp.float32(scale)
    if unfused:
        cos, sin = _unfused(jnp.stack([cos, sin]))
    return cos[:, :, None, :], sin[:, :, None, :]


def _unfused(tables):
    """``tables`` [..., n] float32, with the same bits (a -0.0 may become +0.0), as the result of a dot.

    XLA keeps a dot's result in a buffer of its own and never fuses the dot into its users, so what the tables
    cost is paid once. The product with the identity is exact: each output is its input times one plus products
    with zero. (``lax.optimization_barrier`` does not do this: XLA:CPU removes barriers before fusing.) Only for
    backends whose float32 dots are float32 (the CPU; elsewhere the default precision may round the input).
    """
    n = tables.shape[-1]
    flat = tables.reshape(-1, n)
    return jnp.dot(flat, jnp.eye(n, dtype=jnp.float32), precision="highest").reshape(tables.shape)


def rope(x, tables):
    """Rotary embedding, "rotate half" layout (HF Qwen2/Llama). x: [B, T, H, Dh], in float32."""
    cos, sin = tables
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
