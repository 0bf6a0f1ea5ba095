"""jf-jax: Jacobi Forcing in JAX. The public surface: load a model, generate with a decoding method."""

from jf_jax import xla_flags

xla_flags.apply()  # before anything starts JAX's backend: see jf_jax/xla_flags.py

from jf_jax.api import METHODS, Completion, encode_prompts, generate, load_model, tune  # noqa: E402

__all__ = ["METHODS", "Completion", "encode_prompts", "generate", "load_model", "tune"]
