"""Decoding: greedy AR (the ground truth) and the lossless parallel decoders built on it.

* ``common``: request validation, prompt bucketing, greedy choice, EOS test, ``StopReason``, the result type.
* ``stats``: every statistic (TPF, tokens/s with and without prefill, iterations per block), in one place (their
  tables and the loop rule are evaluation's: ``jf_jax.eval``).
* ``ar``: compiled greedy AR (prefill + ``lax.while_loop``).
* ``blocks``: block arithmetic shared by the block decoders (verify, cap at EOS / max_new_tokens, emit).
* ``runner``: ``BlockDecoder`` (one step, a compiled and a python driver) and the per-prompt request loop.
* ``jacobi``: Jacobi decoding; ``recording``: its trajectories for training.
* ``multiblock`` and ``recycling``: multi-block decoding with rejection recycling ("mr").
"""
