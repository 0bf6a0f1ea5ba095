"""What the processes of a multi-process run (``jax.distributed``) tell each other beyond collectives: ``agree``, a
barrier that carries each process's failure, so that one process's error stops every process with its message
instead of leaving the others waiting."""

from __future__ import annotations

WAIT_SECONDS = 24 * 3600
"""How long ``agree`` waits for the slowest process: each step of a run waits for every process's share of it (a
process that dies is reported sooner, by the coordination service's heartbeats)."""


def agree(step: str, problem: str | None) -> str | None:
    """A barrier that carries failures: this process posts how its share of ``step`` (a name unique in the run)
    went, ``problem`` or None, and waits for every other process's; the first problem posted, in process order,
    or None when every share went well, so all processes stop together rather than wait on one that failed. One
    process: its own ``problem``.

    The posts go through the coordination service's key-value store, not a collective: a collective barrier
    (``multihost_utils.sync_global_devices``) fails when the processes reach it more than gloo's context timeout
    (seconds) apart, and shares of decoding finish minutes apart."""
    import jax

    if jax.process_count() == 1:
        return problem
    from jax._src import distributed  # the client of jax.distributed.initialize: JAX exports no public handle

    client = distributed.global_state.client
    key = f"jf_jax/{step}/process-"
    client.key_value_set(key + str(jax.process_index()), "ok" if problem is None else f"failed: {problem}")
    posts = [client.blocking_key_value_get(key + str(i), WAIT_SECONDS * 1000) for i in range(jax.process_count())]
    return next((f"process {i} {post}" for i, post in enumerate(posts) if post != "ok"), None)
