"""jf-jax: Jacobi Forcing in JAX. The public surface: load a model, generate with a decoding method."""

from jf_jax.api import METHODS, Completion, encode_prompts, generate, load_model, tune

__all__ = ["METHODS", "Completion", "encode_prompts", "generate", "load_model", "tune"]
