"""jf-jax: Jacobi Forcing in JAX. The public surface: load a model, generate with a decoding method."""

__all__ = ["METHODS", "Completion", "encode_prompts", "generate", "load_model", "tune"]


def __getattr__(name: str):
    # The public names load jf_jax.api (and JAX) on first use, so light modules (jf_jax.host_memory, which
    # re-executes a training script before JAX is imported) can be imported without paying for JAX.
    if name in __all__:
        from jf_jax import api

        return getattr(api, name)
    raise AttributeError(f"module 'jf_jax' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
