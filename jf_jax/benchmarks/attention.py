"""Benchmark of the tile-skipping flash-attention kernel on the Jacobi Forcing training mask.

Prints, per tile size: the fraction of (query tile, key tile) pairs the kernel skips for the paper's packing
[prompt, noisy_0, clean_0, ..., noisy_{N-1}, clean_{N-1}] (both copies of block j at positions P + j*n + i),
the ideal fraction (the mask's own density), and, on a GPU, forward time and TFLOP/s of the kernel against
dense masked attention (``attention_reference`` under jit). On a CPU, or with ``--dry-run``, only the
sparsity columns are computed (timing the interpret mode would measure the host, not the kernel).

With ``--backward`` it also times forward + backward, ``jax.grad`` of sum(out * a fixed random cotangent) with
respect to q, k and v under one jit, for the dense reference, the kernel with its fused Triton backward
(``backward="fused"``: the dq and dk/dv kernels of ``triton_attention_backward``) and the kernel with the reference
VJP (``backward="reference"``, the fallback), at the device's default tiles; per variant: median ms, the compiled
program's memory (``memory_analysis()``: temporaries and, where the jax version reports it, the peak) and the
gradients' largest error relative to the dense reference's. Off the GPU (or with ``--dry-run``) the same code runs
once at a tiny shape in interpret mode: a smoke check of the path, whose times are the host's. ``--json PATH``
writes everything; a short summary table is printed last. A failing section prints one error line and the rest
goes on.

    python experiments/bench_attention.py --dry-run                       # sparsity only, any machine
    python experiments/bench_attention.py --dry-run --backward            # + the backward path's CPU smoke check
    # the paper's packing (768 tokens) and 3,072 tokens, forward and forward + backward, on a GPU:
    python experiments/bench_attention.py --batch 8 --tiles 128x32,128x64 --backward --iters 50 --json a768.json
    python experiments/bench_attention.py --prompt 1024 --num-blocks 64 --block-size 16 --batch 4 \
        --tiles 128x32,128x64 --backward --iters 50 --json a3072.json
    python experiments/bench_attention.py --prompt 256 --num-blocks 16 --block-size 16 --tiles 64x64,128x128
    python experiments/bench_attention.py --tiles 64x32,64x64,128x64,128x128   # a tile sweep for tuning.py
    python experiments/bench_attention.py --dry-run --stream-major     # noisy blocks first, then clean blocks
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.benchmarks.records import one_line, write_json
from pallas_kernels.attention_reference import attention_reference
from pallas_kernels.flash_attention import attention, tile_sparsity
from pallas_kernels.mask import MASK_KINDS, MASK_NOISE_CONDITIONED, STREAM_CLEAN, STREAM_NOISY, TokenMeta, dense_mask
from pallas_kernels.tuning import BlockSizes, block_sizes_for


def packed_training_meta(batch: int, prompt: int, num_blocks: int, block_size: int,
                         stream_major: bool = False) -> TokenMeta:
    """Per-token data of the packed training sequence, identical in every row (docs/method.md, section 4).

    ``stream_major`` orders the same tokens [prompt, noisy_0..noisy_{N-1}, clean_0..clean_{N-1}] instead of
    interleaving the streams. The mask is a function of the per-token data, not of the order, so attention
    outputs are the same tokens' outputs permuted; only the tile structure (and so the skipping) changes.
    """
    pos, stream, block = list(range(prompt)), [0] * prompt, [-1] * prompt
    order = ([(s, j) for s in (STREAM_NOISY, STREAM_CLEAN) for j in range(num_blocks)] if stream_major else
             [(s, j) for j in range(num_blocks) for s in (STREAM_NOISY, STREAM_CLEAN)])
    for s, j in order:
        pos += [prompt + j * block_size + i for i in range(block_size)]
        stream += [s] * block_size
        block += [j] * block_size
    row = (np.array(pos), np.zeros(len(pos), int), np.array(stream), np.array(block))
    return TokenMeta(*(jnp.asarray(np.broadcast_to(f, (batch, len(f))), jnp.int32) for f in row))


def causal_meta(batch: int, length: int) -> TokenMeta:
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return TokenMeta(pos, jnp.zeros_like(pos), jnp.zeros_like(pos), jnp.full_like(pos, -1))


def parse_tiles(text: str) -> list[tuple[int, int]]:
    tiles = []
    for item in text.split(","):
        q, _, k = item.partition("x")
        tiles.append((int(q), int(k)))
    return tiles


def time_fn(fn, *args, iters: int) -> float:
    """Median wall time in ms of ``fn(*args)`` after a compile-and-warm-up call."""
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


MEMORY_FIELDS = ("temp_size_in_bytes", "peak_memory_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                 "alias_size_in_bytes", "generated_code_size_in_bytes")


def memory_stats(compiled) -> dict:
    """The fields of ``compiled.memory_analysis()`` that this jax and backend report (the peak is newer)."""
    stats = compiled.memory_analysis()
    if isinstance(stats, (list, tuple)):  # some versions answer per device
        stats = stats[0] if stats else None
    if stats is None:
        return {}
    return {f: int(getattr(stats, f)) for f in MEMORY_FIELDS if getattr(stats, f, None) is not None}


def backward_rows(q, k, v, meta: TokenMeta, mask_kind: str, sizes: BlockSizes, iters: int) -> list[dict]:
    """Forward + backward of each variant: the grad of sum(out * ct) w.r.t. q, k, v, compiled once (the same
    executable is measured and timed). ct is a fixed random float32 cotangent, passed as an argument so that it
    is not folded into the program as a constant. The dense reference runs first: the others' error is
    against its gradients."""
    ct = jax.random.normal(jax.random.PRNGKey(7), q.shape, jnp.float32)
    variants = {
        "dense reference": lambda q, k, v: attention_reference(q, k, v, meta, meta, mask_kind=mask_kind),
        "kernel, fused backward": lambda q, k, v: attention(q, k, v, meta, meta, mask_kind=mask_kind,
                                                            block_sizes=sizes, backward="fused"),
        "kernel, reference VJP": lambda q, k, v: attention(q, k, v, meta, meta, mask_kind=mask_kind,
                                                           block_sizes=sizes, backward="reference"),
    }
    rows, reference_grads = [], None
    for name, fn in variants.items():
        row = dict(variant=name)
        try:
            loss = lambda q, k, v, ct, fn=fn: jnp.sum(fn(q, k, v).astype(jnp.float32) * ct)  # noqa: E731
            compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v, ct).compile()
            row["memory"] = memory_stats(compiled)
            row["ms"] = time_fn(compiled, q, k, v, ct, iters=iters)
            grads = [g.astype(jnp.float32) for g in compiled(q, k, v, ct)]
            if reference_grads is None and name == "dense reference":
                reference_grads = grads
            elif reference_grads is not None:
                # Largest |error| of dq, dk, dv, each relative to the largest |reference gradient| of its tensor.
                row["max_rel_err"] = max(float(jnp.max(jnp.abs(g - r)) / jnp.maximum(jnp.max(jnp.abs(r)), 1e-30))
                                         for g, r in zip(grads, reference_grads))
            del compiled, grads
        except Exception as e:  # one variant failing (no memory, no Triton lowering) must not end the run
            row["error"] = one_line(e)
        rows.append(row)
        memory = row.get("memory", {})
        # The CPU client reports a peak of 0 (not computed there): shown as n/a, kept as reported in the JSON.
        mib = lambda key: f"{memory[key] / 2**20:.1f} MiB" if memory.get(key) else "n/a"  # noqa: E731
        print(f"  {name:<24} " + (f"error: {row['error']}" if "error" in row else
                                  f"{row['ms']:9.3f} ms   temp {mib('temp_size_in_bytes')}, peak "
                                  f"{mib('peak_memory_in_bytes')}"
                                  + (f", max rel. grad error {row['max_rel_err']:.2e}" if "max_rel_err" in row
                                     else "")), flush=True)
    if rows and "ms" in rows[0]:
        for row in rows[1:]:
            if "ms" in row:
                row["speedup_vs_dense"] = rows[0]["ms"] / row["ms"]
    return rows


def run_backward(args, meta, q, k, v, timed: bool, report: dict) -> None:
    if timed:
        sizes = block_sizes_for()
        print(f"forward + backward (grad w.r.t. q, k, v; median of {args.iters}), tiles {sizes.block_q}x"
              f"{sizes.block_k}, {sizes.num_warps} warps, {sizes.num_stages} stages:")
        report["backward"] = dict(shape=dict(q=list(q.shape), k=list(k.shape)), tiles=str(sizes),
                                  rows=backward_rows(q, k, v, meta, args.mask_kind, sizes, args.iters))
        return
    # Off the GPU: the same code once at a tiny shape in interpret mode, so a broken path shows before a GPU run.
    tiny = packed_training_meta(1, 16, 2, 8)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (1, tiny.position.shape[1], h, 16), jnp.float32)
               for key, h in zip(keys, (2, 1, 1)))
    sizes = BlockSizes(block_q=16, block_k=16)
    mode = "interpret mode" if jax.default_backend() == "cpu" else "compiled"
    print(f"forward + backward, smoke check (not a measurement: {mode} at a tiny shape, prompt 16 + 2 blocks of 8, "
          f"2 query heads over 1 KV head, head dim 16, float32, one timed call):")
    report["backward_smoke"] = dict(shape=dict(q=list(q.shape), k=list(k.shape)), tiles=str(sizes),
                                    rows=backward_rows(q, k, v, tiny, args.mask_kind, sizes, 1))


def print_summary(report: dict) -> None:
    """The short table printed last (the full record goes to --json)."""
    print("\nsummary" + ("" if report["timed"] else " (not timed)") + f": {report['tokens']} tokens, batch "
          f"{report['batch']}, {report['dtype']}, {report['device']}")
    if report.get("reference_ms") is not None:
        print(f"  forward  dense masked reference     {report['reference_ms']:9.3f} ms")
    for row in report["tiles"]:
        value = (f"{row['ms']:9.3f} ms" if "ms" in row else row.get("error", "not timed"))
        skip = f"skip {row['skipped']:.3f}" if "skipped" in row else ""
        print(f"  forward  kernel {row['tiles']:<8} {skip:<10}  {value}")
    for key in ("backward", "backward_smoke"):
        for row in report.get(key, {}).get("rows", []):
            temp = row.get("memory", {}).get("temp_size_in_bytes")
            value = (row["error"] if "error" in row else f"{row['ms']:9.3f} ms" + (
                f", temp {temp / 2**20:.1f} MiB" if temp is not None else ""))
            print(f"  fwd+bwd  {row['variant']:<28} {value}" + (" (smoke)" if key == "backward_smoke" else ""))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--tiles", type=parse_tiles, default=parse_tiles("64x64,64x128,128x64,128x128"),
                        help="comma-separated block_q x block_k pairs")
    parser.add_argument("--mask-kind", choices=MASK_KINDS, default=MASK_NOISE_CONDITIONED)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=28, help="query heads (Qwen2.5-7B: 28)")
    parser.add_argument("--kv-heads", type=int, default=4, help="KV heads (Qwen2.5-7B: 4)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--causal-baseline", action="store_true",
                        help="also time plain causal attention of the same length with the same kernel")
    parser.add_argument("--stream-major", action="store_true",
                        help="order the packed tokens [prompt, all noisy blocks, all clean blocks] (see README)")
    parser.add_argument("--dry-run", action="store_true", help="sparsity only (the default off-GPU)")
    parser.add_argument("--backward", action="store_true",
                        help="also forward + backward: dense reference, fused backward, reference VJP (see above)")
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)

    meta = packed_training_meta(args.batch, args.prompt, args.num_blocks, args.block_size, args.stream_major)
    length = meta.position.shape[1]
    density = float(jnp.mean(dense_mask(meta, meta, args.mask_kind)))
    on_gpu = jax.default_backend() == "gpu"
    timed = on_gpu and not args.dry_run
    device = jax.devices()[0].device_kind
    report = dict(command=vars(args) | dict(tiles=[f"{q}x{k}" for q, k in args.tiles], json=str(args.json)),
                  jax=jax.__version__, device=device, devices=[str(d) for d in jax.devices()], timed=timed,
                  tokens=length, batch=args.batch, dtype=args.dtype, mask_density=density, reference_ms=None,
                  tiles=[])
    print(f"packed layout: prompt {args.prompt} + {args.num_blocks} blocks x {args.block_size} x 2 streams "
          f"= {length} tokens, {'stream-major' if args.stream_major else 'interleaved (REF)'} order; "
          f"mask {args.mask_kind}; device {device}")
    print(f"mask density {density:.4f} (ideal skipped fraction at 1-token tiles: {1 - density:.4f}); "
          f"tuning.py default tiles here: {block_sizes_for()}")
    if not timed:
        print("timings skipped: " + ("--dry-run" if on_gpu else f"no GPU (default backend {jax.default_backend()})"))

    shape_q = (args.batch, length, args.heads, args.head_dim)
    shape_kv = (args.batch, length, args.kv_heads, args.head_dim)
    dense_flops = 4.0 * args.batch * args.heads * length * length * args.head_dim  # QK^T and PV, 2 per MAC
    ref_ms = q = k = v = None
    if timed:
        dtype = jnp.dtype(args.dtype)
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q = jax.random.normal(keys[0], shape_q, jnp.float32).astype(dtype)
        k = jax.random.normal(keys[1], shape_kv, jnp.float32).astype(dtype)
        v = jax.random.normal(keys[2], shape_kv, jnp.float32).astype(dtype)
        reference = jax.jit(lambda q, k, v: attention_reference(q, k, v, meta, meta, mask_kind=args.mask_kind))
        try:
            ref_ms = report["reference_ms"] = time_fn(reference, q, k, v, iters=args.iters)
            print(f"dense masked reference: {ref_ms:.3f} ms, {dense_flops / ref_ms / 1e9:.1f} TFLOP/s")
        except Exception as e:  # e.g. out of memory at a large batch: the kernel rows still run
            report["reference_error"] = one_line(e)
            print(f"dense masked reference: error: {report['reference_error']}")

    header = f"{'tiles':>9} {'skipped':>8} {'ideal':>7}"
    if timed:
        header += f" {'ms':>8} {'speedup':>8} {'TFLOP/s dense-eq':>17} {'TFLOP/s visited':>16} {'max|err|':>9}"
    print(header)
    for block_q, block_k in args.tiles:
        row = dict(tiles=f"{block_q}x{block_k}")
        report["tiles"].append(row)
        try:
            skipped = row["skipped"] = float(tile_sparsity(meta, meta, block_q=block_q, block_k=block_k,
                                                           mask_kind=args.mask_kind))
        except Exception as e:
            row["error"] = one_line(e)
            print(f"{block_q:>4}x{block_k:<4} error: {row['error']}")
            continue
        line = f"{block_q:>4}x{block_k:<4} {skipped:>8.4f} {1 - density:>7.4f}"
        if timed:
            sizes = BlockSizes(block_q=block_q, block_k=block_k, num_warps=block_sizes_for().num_warps,
                               num_stages=block_sizes_for().num_stages)
            kernel = jax.jit(lambda q, k, v, sizes=sizes: attention(q, k, v, meta, meta, mask_kind=args.mask_kind,
                                                                    block_sizes=sizes))
            try:
                ms = row["ms"] = time_fn(kernel, q, k, v, iters=args.iters)
            except Exception as e:  # e.g. 128x128 bf16 tiles at 3 stages: over an H100's shared memory
                row["error"] = "does not run: " + one_line(e)
                print(line + f"  {row['error']}")
                continue
            line += f" {ms:>8.3f}"
            line += f" {ref_ms / ms:>8.2f}" if ref_ms else f" {'-':>8}"
            line += f" {dense_flops / ms / 1e9:>17.1f} {dense_flops * (1 - skipped) / ms / 1e9:>16.1f}"
            if ref_ms:
                err = row["max_abs_err"] = float(jnp.max(jnp.abs(kernel(q, k, v).astype(jnp.float32)
                                                                 - reference(q, k, v).astype(jnp.float32))))
                line += f" {err:>9.2e}"
        print(line)

    if timed and args.causal_baseline:
        try:
            causal = causal_meta(args.batch, length)
            sizes = block_sizes_for()
            kernel = jax.jit(lambda q, k, v: attention(q, k, v, causal, causal, block_sizes=sizes))
            ms = time_fn(kernel, q, k, v, iters=args.iters)
            skipped = float(tile_sparsity(causal, causal, block_q=sizes.block_q, block_k=sizes.block_k))
            report["causal_baseline"] = dict(ms=ms, skipped=skipped, tiles=f"{sizes.block_q}x{sizes.block_k}")
            print(f"causal, same length, tiles {sizes.block_q}x{sizes.block_k}: skipped {skipped:.4f}, {ms:.3f} ms")
        except Exception as e:
            report["causal_baseline"] = dict(error=one_line(e))
            print(f"causal baseline: error: {one_line(e)}")

    if args.backward:
        try:
            run_backward(args, meta, q, k, v, timed, report)
        except Exception as e:
            report["backward_error"] = one_line(e)
            print(f"forward + backward: error: {report['backward_error']}")
    if args.json is not None:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.backward:  # last, after the JSON line (without --backward the output is what it always was)
        print_summary(report)


if __name__ == "__main__":
    main()
