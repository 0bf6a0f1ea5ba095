"""The model: its config, its parameters (declared once), the transformer as pure functions, the KV cache and
the per-token mask data attention reads.

* ``config``: ``ModelConfig`` (frozen, hashable) and ``from_hf_config``.
* ``params``: every parameter declared once -> abstract tree, random init, checks, logical axes.
* ``decode_view``: ``DecodeView``, the same parameters held per layer (and column-sharded) for decoding;
  ``as_decode_view``, the decoders' one conversion of whatever layout they are handed.
* ``weight_matmul``: ``matmul``, ``x @ w`` for every form of a matmul weight (shards, packed, int8);
  ``mixed_einsum``, the bf16 training dot.
* ``transformer``: ``forward`` (stacked params under ``lax.scan``, or a ``DecodeView``), ``logits``.
* ``kv_cache``: ``KVCache``: write a block at the committed length, commit or roll back by moving it.
* ``token_meta``: ``TokenMeta`` constructors for plain text and cache slots (the rule is ``pallas_kernels.mask``).
* ``sharding``: logical-axis rules -> mesh shardings.
"""
