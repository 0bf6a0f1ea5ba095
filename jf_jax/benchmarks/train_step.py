"""The Jacobi Forcing train step on SmolLM2-135M, measured side by side: seconds per step, packed tokens/s, the
fraction of the machine's matmul peak, and what each part of the step costs.

Batches are packed from synthetic trajectories shaped like the real ones (a prompt, T blocks of n tokens, noisy
states from the progressive schedule) over SmolLM2's vocabulary, so no collection is needed. Every variant runs
the same batches from the same weights; its loss after the first step is printed, so variants that must compute
the same thing can be compared.

    python experiments/bench_train_step.py --variants float32,bfloat16,bfloat16-remat \
        --json results/studies/train_step_speed/train_step.json
    python experiments/bench_train_step.py --variants float32,bfloat16-remat --batch 1,4,8 --steps 5

With several ``--batch`` sizes every (variant, batch) pair is timed in the same process, and the table gives
seconds per *example* (packed response) and examples/s against the first pair: a step's fixed costs (the
optimizer over all 135M parameters, zero-filled gradient stacks of the layer scan, the embedding's cast) are
paid once per step, so larger batches spread them.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from jf_jax.benchmarks.records import write_json
from jf_jax.weights import embedded


def packed_batches(vocab: int, *, count: int, batch: int, prompt_len: int, block_size: int, blocks: int,
                   row_len: int, seed: int = 0) -> list[dict]:
    """``count`` batches of ``batch`` rows, one packed synthetic response per row, padded to ``row_len``."""
    from jf_jax.training.noise_schedule import select_noisy_blocks
    from jf_jax.training.packing import Example, make_batch, pack_example
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts

    recorder = SyntheticRecorder(block_size=block_size, num_blocks=blocks, vocab_size=vocab)
    prompts = make_prompts(count * batch, prompt_len, vocab, seed)
    out = []
    for i in range(count):
        rows = []
        for prompt in prompts[i * batch:(i + 1) * batch]:
            noisy, clean, _ = select_noisy_blocks(recorder(prompt), window=block_size)
            rows.append([pack_example(Example(prompt, noisy, clean), eos_id=None, pad_id=0)])
        out.append(make_batch(rows, row_len, pad_id=0))
    return out


@dataclasses.dataclass(frozen=True)
class Variant:
    dtype: str  # compute dtype; master weights and optimizer state stay float32
    remat: bool = False  # recompute each layer's activations in the backward (ModelConfig.remat)


VARIANTS = {"float32": Variant("float32"), "bfloat16": Variant("bfloat16"),
            "float32-remat": Variant("float32", True), "bfloat16-remat": Variant("bfloat16", True)}


def time_variant(variant: Variant, cfg, params, batches, steps: int) -> dict:
    import jax

    from jf_jax.model.sharding import ShardingRules
    from jf_jax.training.losses import LossConfig
    from jf_jax.model.params import abstract_params
    from jf_jax.training.state import OptimConfig, init_state, make_optimizer, state_shardings
    from jf_jax.training.step import make_train_step, put_batch
    from jf_jax.model.sharding import make_mesh

    cfg = cfg.replace(dtype=variant.dtype, param_dtype="float32", remat=variant.remat)
    lcfg, ocfg = LossConfig(consistency_weight=20.0), OptimConfig(learning_rate=1e-4, warmup_steps=1)
    mesh, rules = make_mesh(1, -1), ShardingRules()
    optimizer = make_optimizer(cfg, ocfg, steps + 1)
    shardings = state_shardings(cfg, optimizer, abstract_params(cfg), mesh, rules)
    step_fn = make_train_step(cfg, lcfg, ocfg, steps + 1, mesh, rules, shardings)
    state = jax.jit(lambda p: init_state(p, optimizer), out_shardings=shardings)(jax.device_put(params,
                                                                                                shardings.params))
    start = time.perf_counter()
    state, metrics = step_fn(state, put_batch(batches[0], mesh, rules))
    first_loss = float(metrics["loss/total"])
    compile_s = time.perf_counter() - start
    seconds, losses = [], [first_loss]
    for i in range(steps):
        batch = put_batch(batches[(i + 1) % len(batches)], mesh, rules)
        start = time.perf_counter()
        state, metrics = step_fn(state, batch)
        losses.append(float(metrics["loss/total"]))
        seconds.append(time.perf_counter() - start)
    return dict(dtype=variant.dtype, remat=variant.remat, compile_and_first_step_seconds=compile_s,
                step_seconds=seconds, median_step_seconds=statistics.median(seconds), losses=losses)


def step_flops(cfg, tokens: int, row_len: int) -> float:
    """Matmul FLOPs of one train step (forward + backward = 3x forward, no recomputation) for ``tokens`` packed
    tokens in rows of ``row_len``: every layer's projections, attention scores and values over the row, and the
    LM head over every token."""
    D, F, H, K, Dh, V = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.vocab_size)
    per_token_layer = 2 * D * (H * Dh + 2 * K * Dh) + 2 * H * Dh * D + 3 * 2 * D * F + 2 * 2 * H * Dh * row_len
    return 3 * (cfg.num_layers * per_token_layer * tokens + 2 * D * V * tokens)


def main(argv=None, program: str = "python -m jf_jax.benchmarks.train_step") -> int:
    """The command line above; ``program`` is how the report's ``command`` names what ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="float32,bfloat16")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant (after one compiled step)")
    parser.add_argument("--batch", default="1", help="packed rows per step; a comma list times each")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=7, help="blocks per response (T)")
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--row-len", type=int, default=320)
    parser.add_argument("--peak-gflops", type=float, default=350.0,
                        help="the machine's matmul peak for the fraction column (2 cores AVX512-BF16: ~350)")
    parser.add_argument("--random-init", action="store_true",
                        help="SmolLM2-135M's shapes with random weights (no model package needed: times only)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; available: {sorted(VARIANTS)}")

    from jf_jax import weights

    try:
        batch_sizes = [int(b) for b in args.batch.split(",")]
    except ValueError:
        parser.error(f"--batch takes comma-separated whole numbers, got {args.batch!r}")
    if any(b < 1 for b in batch_sizes):
        parser.error(f"--batch sizes must be >= 1, got {args.batch!r}")
    if args.random_init:
        import types

        import jax

        from jf_jax.model.params import init_params

        cfg = embedded.SMOLLM2_135M_CONFIG
        loaded = types.SimpleNamespace(cfg=cfg, params=init_params(cfg, jax.random.key(0)))
    else:
        loaded = weights.load("smollm2-135m", dtype="float32")
    report = dict(command=f"{program} " + " ".join(argv if argv is not None else sys.argv[1:]),
                  variants={})
    baseline = None
    for batch_size in batch_sizes:
        batches = packed_batches(loaded.cfg.vocab_size, count=args.steps + 1, batch=batch_size,
                                 prompt_len=args.prompt_len, block_size=args.block_size, blocks=args.blocks,
                                 row_len=args.row_len)
        tokens = int(sum((b["segment"] >= 0).sum() for b in batches) / len(batches))
        pairs = int(sum((b["cons_weight"] > 0).sum() for b in batches) / len(batches))
        flops = step_flops(loaded.cfg, tokens, args.row_len)
        report.update(tokens_per_example=tokens // batch_size, consistency_pairs_per_example=pairs // batch_size,
                      matmul_gflop_per_example=flops / 1e9 / batch_size)
        for name in args.variants.split(","):
            r = time_variant(VARIANTS[name], loaded.cfg, loaded.params, batches, args.steps)
            r.update(batch=batch_size, seconds_per_example=r["median_step_seconds"] / batch_size,
                     tokens_per_second=tokens / r["median_step_seconds"],
                     fraction_of_peak=flops / r["median_step_seconds"] / (args.peak_gflops * 1e9))
            baseline = baseline or r["seconds_per_example"]
            r["examples_per_second_vs_first"] = baseline / r["seconds_per_example"]
            key = name if len(batch_sizes) == 1 else f"{name}-batch{batch_size}"
            report["variants"][key] = r
            print(f"{key}: {r['median_step_seconds']:.2f} s/step, {r['seconds_per_example']:.2f} s/example "
                  f"({r['examples_per_second_vs_first']:.2f}x the first), {r['tokens_per_second']:.0f} packed tok/s, "
                  f"{100 * r['fraction_of_peak']:.0f}% of {args.peak_gflops:.0f} GFLOP/s; losses "
                  + " ".join(f"{x:.3f}" for x in r["losses"]), flush=True)
    if args.json is not None:
        write_json(args.json, report)
        plot_losses(report, args.json.with_suffix(".png"))
    return 0


def plot_losses(report: dict, path: Path) -> None:
    """The variants' loss curves on the same batches (equal curves: the variant computes the same training)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in report["variants"].items():
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=f"{name} ({r['median_step_seconds']:.2f} s/step)",
                linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("total loss")
    ax.set_title("Jacobi Forcing train step on SmolLM2-135M, same batches")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
