"""Benchmark of the tile-skipping flash-attention kernel on the Jacobi Forcing training mask.

Prints, per tile size: the fraction of (query tile, key tile) pairs the kernel skips for the paper's packing
[prompt, noisy_0, clean_0, ..., noisy_{N-1}, clean_{N-1}] (both copies of block j at positions P + j*n + i),
the ideal fraction (the mask's own density), and, on a GPU, forward time and TFLOP/s of the kernel against
dense masked attention (``attention_reference`` under jit). On a CPU, or with ``--dry-run``, only the
sparsity columns are computed (timing the interpret mode would measure the host, not the kernel).

    python experiments/bench_attention.py --dry-run                       # sparsity only, any machine
    python experiments/bench_attention.py --prompt 256 --num-blocks 16 --block-size 16 --tiles 64x64,128x128
    python experiments/bench_attention.py --tiles 64x32,64x64,128x64,128x128   # a tile sweep for tuning.py
    python experiments/bench_attention.py --dry-run --stream-major     # noisy blocks first, then clean blocks
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

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
    args = parser.parse_args(argv)

    meta = packed_training_meta(args.batch, args.prompt, args.num_blocks, args.block_size, args.stream_major)
    length = meta.position.shape[1]
    density = float(jnp.mean(dense_mask(meta, meta, args.mask_kind)))
    on_gpu = jax.default_backend() == "gpu"
    timed = on_gpu and not args.dry_run
    device = jax.devices()[0].device_kind
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
    if timed:
        dtype = jnp.dtype(args.dtype)
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q = jax.random.normal(keys[0], shape_q, jnp.float32).astype(dtype)
        k = jax.random.normal(keys[1], shape_kv, jnp.float32).astype(dtype)
        v = jax.random.normal(keys[2], shape_kv, jnp.float32).astype(dtype)
        reference = jax.jit(lambda q, k, v: attention_reference(q, k, v, meta, meta, mask_kind=args.mask_kind))
        ref_ms = time_fn(reference, q, k, v, iters=args.iters)
        print(f"dense masked reference: {ref_ms:.3f} ms, {dense_flops / ref_ms / 1e9:.1f} TFLOP/s")

    header = f"{'tiles':>9} {'skipped':>8} {'ideal':>7}"
    if timed:
        header += f" {'ms':>8} {'speedup':>8} {'TFLOP/s dense-eq':>17} {'TFLOP/s visited':>16} {'max|err|':>9}"
    print(header)
    for block_q, block_k in args.tiles:
        skipped = float(tile_sparsity(meta, meta, block_q=block_q, block_k=block_k, mask_kind=args.mask_kind))
        line = f"{block_q:>4}x{block_k:<4} {skipped:>8.4f} {1 - density:>7.4f}"
        if timed:
            sizes = BlockSizes(block_q=block_q, block_k=block_k, num_warps=block_sizes_for().num_warps,
                               num_stages=block_sizes_for().num_stages)
            kernel = jax.jit(lambda q, k, v, sizes=sizes: attention(q, k, v, meta, meta, mask_kind=args.mask_kind,
                                                                    block_sizes=sizes))
            try:
                ms = time_fn(kernel, q, k, v, iters=args.iters)
            except jax.errors.JaxRuntimeError as e:  # e.g. 128x128 bf16 tiles at 3 stages: over an H100's shared memory
                print(line + f"  does not run: {str(e).splitlines()[0][:120]}")
                continue
            err = float(jnp.max(jnp.abs(kernel(q, k, v).astype(jnp.float32)
                                        - reference(q, k, v).astype(jnp.float32))))
            line += (f" {ms:>8.3f} {ref_ms / ms:>8.2f} {dense_flops / ms / 1e9:>17.1f}"
                     f" {dense_flops * (1 - skipped) / ms / 1e9:>16.1f} {err:>9.2e}")
        print(line)

    if timed and args.causal_baseline:
        causal = causal_meta(args.batch, length)
        sizes = block_sizes_for()
        kernel = jax.jit(lambda q, k, v: attention(q, k, v, causal, causal, block_sizes=sizes))
        ms = time_fn(kernel, q, k, v, iters=args.iters)
        skipped = float(tile_sparsity(causal, causal, block_q=sizes.block_q, block_k=sizes.block_k))
        print(f"causal, same length, tiles {sizes.block_q}x{sizes.block_k}: skipped {skipped:.4f}, {ms:.3f} ms")


if __name__ == "__main__":
    main()
