"""What programs a test compiled: the model's stack is traced once per program, so recording its arguments' shapes
lists the forwards a run compiles."""

from __future__ import annotations

from jf_jax.model import transformer


def record_stack_traces(monkeypatch) -> list[tuple]:
    """Patches the model's stack to append ``(token shape, cache capacity or None, whole_cache)`` to the returned
    list at every trace (a config no other test compiles makes every program of the test trace here)."""
    traced = []
    stack = transformer._stack

    def recording(params, cfg, tokens, positions, q_meta, cache, mask_kind, whole_cache=False, platform=None):
        traced.append((tuple(tokens.shape), None if cache is None else cache.capacity, whole_cache))
        return stack(params, cfg, tokens, positions, q_meta, cache, mask_kind, whole_cache, platform)

    monkeypatch.setattr(transformer, "_stack", recording)
    return traced
