"""Where a cached forward's time goes: one bf16 (or other dtype) forward of t tokens over a context, as the
decoders run it (+ logits + argmax), traced with ``jax.profiler`` and its operations summed by kind: each CPU
kernel by its FFI target, each XLA fusion by its name without the number. Per forward, summed over threads.

    python experiments/profile_forward.py --tokens 1,8,64 [--dtype bfloat16] [--context 256] [--json out.json]

The kinds are what to look at: a fusion kind whose time grows faster than its work (a transcendental recomputed
in every layer, say) shows up beside the GEMM and attention kernels.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

_PLUMBING = ("$", "Thunk", "Pjit", "Common", "end: ", "Handle ", "ParseArguments", "Allocate", "PythonRef")


def op_kinds(hlo_text: str) -> dict[str, str]:
    """Instruction name -> its kind: a custom call's target, else the name without its trailing number."""
    kinds = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if m:
            target = re.search(r'custom_call_target="([^"]+)"', line)
            kinds[m.group(1)] = target.group(1) if target else re.sub(r"\.\d+$", "", m.group(1))
    return kinds


def profile(model, tokens: int, context: int, forwards: int = 10) -> dict:
    import jax
    import jax.numpy as jnp

    from jf_jax.decoding.common import greedy
    from jf_jax.model.decode_jit import decode_jit
    from jf_jax.model.decode_view import as_decode_view
    from jf_jax.model.kv_cache import KVCache
    from jf_jax.model.transformer import forward, logits

    cfg, params = model.cfg, as_decode_view(model.params)

    @decode_jit
    def step(params, tokens, cache):
        hidden, cache = forward(params, cfg, tokens, cache=cache)
        return greedy(logits(params, cfg, hidden)), cache

    cache = KVCache.init(cfg, 1, context + tokens).with_lengths(context)
    ids = (jnp.arange(tokens, dtype=jnp.int32) * 7919 % cfg.vocab_size)[None]
    kinds = op_kinds(step.program().lower(params, ids, cache).compile().as_text())
    jax.block_until_ready(step(params, ids, cache))
    seconds = []
    for _ in range(forwards):
        start = time.perf_counter()
        jax.block_until_ready(step(params, ids, cache))
        seconds.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(forwards):
                jax.block_until_ready(step(params, ids, cache))
        (trace,) = Path(trace_dir).rglob("*.trace.json.gz")
        events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    ms, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(_PLUMBING):
            kind = kinds.get(e["name"], e["name"])
            ms[kind] += e["dur"] / 1e3 / forwards
            calls[kind] += 1
    return dict(tokens=tokens, median_ms=1e3 * statistics.median(seconds),
                kinds={k: dict(ms=round(v, 3), calls_per_forward=calls[k] // forwards) for k, v in ms.most_common()})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", default="1,8", help="comma-separated token counts t")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--top", type=int, default=12, help="kinds printed per t")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from jf_jax import api
    from jf_jax.model import machine

    model = api.load_model(args.model, dtype=args.dtype)
    results = []
    for t in (int(x) for x in args.tokens.split(",")):
        r = profile(model, t, args.context)
        results.append(r)
        print(f"t={t}: {r['median_ms']:.2f} ms per forward (median untraced); traced, by kind:")
        for kind, v in list(r["kinds"].items())[:args.top]:
            print(f"  {v['ms']:8.3f} ms  {v['calls_per_forward']:4d} calls  {kind}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(command="python " + " ".join(sys.argv), machine=machine.detect(),
                                                   dtype=args.dtype, context=args.context, forwards=results),
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
