"""``gpu_7b train``: the recipe's train step (KL from a frozen bf16 reference, consistency weight 20,
noise-conditioned mask) at bf16 compute, float32 parameters and AdamW state, remat per layer, on synthetic packed
trajectories. Candidates from the recipe's batch down: each is compiled ahead of time and its
``memory_analysis()`` read before anything is allocated; the first whose need fits the device runs. The command
line is ``jf_jax.benchmarks.gpu_7b``."""

from __future__ import annotations

import statistics
import sys
import time

import jax
import numpy as np

from jf_jax.benchmarks.device import device_memory, environment, named_config
from jf_jax.benchmarks.records import BudgetedReport
from jf_jax.benchmarks.train_step import packed_batches, step_flops

GIB = 2**30

TRAIN_CANDIDATES = (  # (name, ar_teacher, batch rows, layers): the recipe at 7B first, then what frees memory
    ("recipe", "reference", 4, None),
    ("no reference (ce), 1 row", "data", 1, None),
    ("recipe, 24 of 28 layers", "reference", 4, 24),
    ("recipe, 20 of 28 layers", "reference", 4, 20),
)
"""XLA:CPU's memory analysis of the same programs (``--compile-only`` on the CPU) put the recipe at 159.7 GiB and
the whole model's leanest step (no reference, 1 row) at 141.9: float32 parameters, AdamW's two moments and the
gradients alone are 16 bytes a parameter (113.5 GiB at 7.6 B). Fewer layers keep the widths, so the largest
layer count that fits says what one chip holds and how the step time scales."""


def abstract_like(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def train_candidate(cfg, teacher: str, rows: int, args, limit: int | None) -> dict:
    from jf_jax.model.params import abstract_params, init_params, param_bytes
    from jf_jax.model.sharding import ShardingRules, batch_shardings, make_mesh
    from jf_jax.training.losses import LossConfig
    from jf_jax.training.state import OptimConfig, abstract_state, init_state, make_optimizer, state_shardings
    from jf_jax.training.step import make_train_step, put_batch, reference_params

    lcfg = LossConfig(ar_weight=10.0, consistency_weight=20.0, mask="noise_conditioned", ar_teacher=teacher)
    ocfg = OptimConfig(learning_rate=2e-4, warmup_steps=10, end_lr_ratio=0.1, b1=0.9, b2=0.95, clip_norm=1.0)
    total = 100
    mesh, rules = make_mesh(1, -1), ShardingRules()
    optimizer = make_optimizer(cfg, ocfg, total)
    abstract = abstract_params(cfg)
    shardings = state_shardings(cfg, optimizer, abstract, mesh, rules)
    ref_abstract = (abstract_like(jax.eval_shape(lambda p: reference_params(p, cfg), abstract), shardings.params)
                    if teacher == "reference" else None)
    batches = packed_batches(cfg.vocab_size, count=args.steps + 1, batch=rows, prompt_len=args.prompt_len,
                             block_size=args.train_block, blocks=args.train_blocks, row_len=args.row_len)
    batch_sh = batch_shardings(batches[0], mesh, rules)
    step_fn = make_train_step(cfg, lcfg, ocfg, total, mesh, rules, shardings, reference=ref_abstract)
    start = time.perf_counter()
    compiled = step_fn.lower(abstract_state(cfg, optimizer, abstract, shardings),
                             abstract_like(batches[0], batch_sh)).compile()
    m = compiled.memory_analysis()
    need = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
    state_like = abstract_state(cfg, optimizer, abstract, shardings)
    out = dict(teacher=teacher, rows=rows, row_len=args.row_len, layers=cfg.num_layers,
               compile_seconds=time.perf_counter() - start, parameters=n_params,
               param_bytes_float32=param_bytes(abstract), state_bytes=param_bytes(state_like),
               reference_bytes=0 if ref_abstract is None else param_bytes(ref_abstract),
               memory_analysis=dict(arguments=m.argument_size_in_bytes, outputs=m.output_size_in_bytes,
                                    temporaries=m.temp_size_in_bytes, aliased=m.alias_size_in_bytes,
                                    generated_code=m.generated_code_size_in_bytes, need=need),
               device_limit=limit)
    print(f"  {cfg.num_layers} layers, {teacher} x {rows}: compiled in {out['compile_seconds']:.0f} s; arguments "
          f"{m.argument_size_in_bytes / GIB:.1f} GiB, temporaries {m.temp_size_in_bytes / GIB:.1f} GiB, "
          f"need {need / GIB:.1f} GiB of {(limit or 0) / GIB:.1f}", flush=True)
    if args.compile_only or (limit is not None and need > limit):
        out["fits"] = None if args.compile_only else False
        return out
    out["fits"] = True
    params = jax.jit(init_params, static_argnums=0, out_shardings=shardings.params)(cfg, jax.random.key(0))
    reference = jax.jit(lambda p: reference_params(p, cfg))(params) if teacher == "reference" else None
    state = jax.jit(lambda p: init_state(p, optimizer), out_shardings=shardings, donate_argnums=0)(params)
    del params
    seconds, losses = [], []
    for i, batch in enumerate(batches):
        device_batch = put_batch(batch, mesh, rules)
        begin = time.perf_counter()
        state, metrics = compiled(state, device_batch, reference)
        losses.append(float(metrics["loss/total"]))
        if i:
            seconds.append(time.perf_counter() - begin)
    tokens = int(sum((b["segment"] >= 0).sum() for b in batches) / len(batches))
    step_s = statistics.median(seconds)
    flops = step_flops(cfg, tokens, args.row_len) * 4 / 3  # remat: the forward once more
    out.update(step_seconds=seconds, median_step_seconds=step_s, losses=losses, tokens_per_step=tokens,
               tokens_per_second=tokens / step_s, matmul_tflop_per_step=flops / 1e12,
               tflop_per_second=flops / step_s / 1e12, memory=device_memory())
    print(f"  ran: {step_s:.2f} s/step, {tokens / step_s:.0f} tok/s, {flops / step_s / 1e12:.0f} TFLOP/s (remat "
          f"counted), peak {out['memory'].get('peak_bytes_in_use', 0) / GIB:.1f} GiB; losses "
          + " ".join(f"{x:.3f}" for x in losses), flush=True)
    return out


def train_main(args) -> int:
    cfg = named_config(args.config).replace(dtype="bfloat16", param_dtype="float32", remat=True)
    report = BudgetedReport.start(args.out / "train.json", args.budget_s, command=" ".join(sys.argv),
                                  model=args.config, config=cfg.to_dict(),
                                  settings={k: str(v) for k, v in vars(args).items()})
    report.data["environment"] = report.run("environment", 0, environment)
    limit = device_memory().get("bytes_limit")
    report.data["device_memory"] = device_memory()
    for name, teacher, rows, layers in TRAIN_CANDIDATES[:1] if args.compile_only else TRAIN_CANDIDATES:
        layer_cfg = cfg if layers is None else cfg.replace(num_layers=layers)
        result = report.run(name, args.train_need_s, train_candidate, layer_cfg, teacher, rows, args, limit)
        if result and "median_step_seconds" in result:
            break
    print(f"wrote {report.path}")
    return 0
