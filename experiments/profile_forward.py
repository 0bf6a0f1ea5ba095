"""Where a cached forward's time goes: one bf16 (or other dtype) forward of t tokens over a context, as the
decoders run it (+ logits + argmax), traced with ``jax.profiler`` and its operations summed by kind: each CPU
kernel by its FFI target, each XLA fusion by its name without the number. Per forward, summed over threads.
With ``--generate``, one whole decode of a prompt instead (its loop's own operations beside the forward's), per
forward of that decode.

    python experiments/profile_forward.py --tokens 1,8,64 [--dtype bfloat16] [--context 256] [--json out.json]
    python experiments/profile_forward.py --generate mr --block-size 8

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

# Trace events that are not operations of their own: Python and runtime frames, and the control-flow operations
# whose time is that of the operations inside them.
_PLUMBING = ("$", "Thunk", "Pjit", "Common", "end: ", "Handle ", "ParseArguments", "Allocate", "PythonRef",
             "np.asarray", "ArrayImpl", "while", "cond", "conditional", "call")


def op_kinds(hlo_text: str) -> dict[str, str]:
    """Instruction name -> its kind: a custom call's target, else the name without its trailing number."""
    kinds = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if m:
            target = re.search(r'custom_call_target="([^"]+)"', line)
            kinds[m.group(1)] = target.group(1) if target else re.sub(r"\.\d+$", "", m.group(1))
    return kinds


def _kind_totals(trace_dir: str, kinds: dict[str, str], per: int) -> dict:
    """Milliseconds and calls per ``per`` (forwards) of each kind in the one trace under ``trace_dir``."""
    (trace,) = Path(trace_dir).rglob("*.trace.json.gz")
    events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    ms, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(_PLUMBING):
            kind = kinds.get(e["name"], re.sub(r"\.\d+$", "", e["name"]))
            ms[kind] += e["dur"] / 1e3 / per
            calls[kind] += 1
    return {k: dict(ms=round(v, 3), calls_per_forward=round(calls[k] / per, 1)) for k, v in ms.most_common()}


def profile_generate(model, method: str, block_size: int, max_new_tokens: int = 64) -> dict:
    """One decode of a fixed prompt (compiled by a first, untraced decode), its operations by kind per forward.
    Inside a decode loop XLA names a kind by its fusion (the FFI targets are not looked up: ``ffi_call``)."""
    import jax

    from jf_jax import api

    options = {} if method == "ar" else dict(block_size=block_size)
    prompt = ["Write a Python function that merges two sorted lists into one sorted list."]
    api.generate(model, prompt, method=method, max_new_tokens=max_new_tokens, **options)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            (result,) = api.generate(model, prompt, method=method, max_new_tokens=max_new_tokens, **options)
        kinds = _kind_totals(trace_dir, {}, result.forwards)
    return dict(method=method, block_size=block_size, forwards=result.forwards, new_tokens=result.new_tokens,
                ms_per_forward=1e3 * result.seconds / result.forwards, kinds=kinds)


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
        totals = _kind_totals(trace_dir, kinds, forwards)
    return dict(tokens=tokens, median_ms=1e3 * statistics.median(seconds), kinds=totals)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", default="1,8", help="comma-separated token counts t")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--top", type=int, default=12, help="kinds printed per t")
    parser.add_argument("--generate", choices=("ar", "jacobi", "mr"),
                        help="profile one decode with this method instead of single forwards")
    parser.add_argument("--block-size", type=int, default=8, help="with --generate: the block size n")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from jf_jax import api
    from jf_jax.model import machine

    model = api.load_model(args.model, dtype=args.dtype)
    results = []
    if args.generate:
        results.append(profile_generate(model, args.generate, args.block_size))
    else:
        results.extend(profile(model, int(t), args.context) for t in args.tokens.split(","))
    for r in results:
        if args.generate:
            print(f"{args.generate} n={args.block_size}: {r['forwards']} forwards for {r['new_tokens']} tokens, "
                  f"{r['ms_per_forward']:.2f} ms per forward; traced, per forward, by kind:")
        else:
            print(f"t={r['tokens']}: {r['median_ms']:.2f} ms per forward (median untraced); traced, by kind:")
        for kind, v in list(r["kinds"].items())[:args.top]:
            print(f"  {v['ms']:8.3f} ms  {v['calls_per_forward']:6.1f} calls  {kind}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(command="python " + " ".join(sys.argv), machine=machine.detect(),
                                                   dtype=args.dtype, context=args.context, forwards=results),
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
