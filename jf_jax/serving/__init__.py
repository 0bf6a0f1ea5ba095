"""``jf-jax serve``: an OpenAI-compatible HTTP server whose continuous batch decodes with lossless Jacobi / multi-block
decoding (docs/serving.md).

Layers, lowest first: ``batch`` (the fixed shapes of a server and the jitted row programs: prefill one request into
a one-row state, insert it into its slot of the B-row batch state), ``text`` (incremental detokenization and stop
strings), ``protocol`` (OpenAI request parsing and validation, error bodies) and ``responses`` (response and
streaming chunk bodies), ``metrics`` (Prometheus text), ``group`` (the slots, batch state and decoders of one served
(method, block size)), ``engine`` (the scheduler thread that admits, steps every group and streams), ``app`` (the
Starlette routes, and the uvicorn server that drains on SIGTERM) and ``command`` (``jf-jax serve``'s options,
warm-up).
"""
