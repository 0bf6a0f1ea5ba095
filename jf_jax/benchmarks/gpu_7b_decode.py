"""``gpu_7b decode``: on random weights of the model's shapes, in order, each section skipped (and recorded so)
when the budget cannot hold it: the device bandwidth, the model made on the device, AR against the bandwidth bound
at batch 1 and ``--ar-batch``, one cached forward's latency per token count (the knee), and ar / jacobi / mr at
the decode shape that covers them (tokens compared with AR's) and unpadded. The command line is
``jf_jax.benchmarks.gpu_7b``."""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

from jf_jax.benchmarks.device import device_memory, environment, measure_bandwidth, named_config, random_prompts
from jf_jax.benchmarks.records import BudgetedReport


def build_view(cfg):
    """Random bf16 weights made on the device (one jitted init), then the decoders' per-layer view."""
    from jf_jax.model.decode_view import decode_view
    from jf_jax.model.params import count_params, init_params
    from jf_jax.tuning.measure import step_weight_bytes

    start = time.perf_counter()
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
    view = decode_view(params)
    del params
    jax.block_until_ready(view)
    row = view.embed.shape[-1] * view.embed.dtype.itemsize
    info = dict(parameters=count_params(jax.tree.leaves(view)), init_seconds=time.perf_counter() - start,
                step_weight_bytes=step_weight_bytes(view) + row, memory=device_memory())
    print(f"model: {info['parameters'] / 1e9:.2f} B parameters, {info['step_weight_bytes'] / 1e9:.2f} GB read per "
          f"step, made in {info['init_seconds']:.1f} s", flush=True)
    return view, info


def kv_bytes_per_slot(cfg) -> int:
    """Key + value bytes of one cached position over every layer (the cache is in the compute dtype)."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(cfg.compute_dtype).itemsize


def run_generate(method: str, view, cfg, prompts, args, batch_size: int = 1, shape=None, **extra) -> dict:
    from jf_jax.decoding.ar import generate_ar
    from jf_jax.decoding.jacobi import generate_jacobi
    from jf_jax.decoding.multiblock import generate_mr

    generate = dict(ar=generate_ar, jacobi=generate_jacobi, mr=generate_mr)[method]
    options = dict(max_new_tokens=args.tokens, eos_ids=[], batch_size=batch_size, driver="compiled",
                   decode_shape=shape, **extra)
    start = time.perf_counter()
    generate(view, cfg, prompts[:batch_size], warmup=True, **options)  # compiles, then one untimed run
    compile_s = time.perf_counter() - start
    result = generate(view, cfg, prompts, warmup=False, **options)
    total = result.stats["total"]
    decode_s = total["seconds"] - total["prefill_seconds"]
    steps = total["forwards"] - len(prompts)  # after each prompt's prefill (which counts as a forward)
    out = dict(method=method, batch_size=batch_size, decode_shape=None if shape is None else str(shape),
               prompts=len(prompts), tokens=int(total["tokens"]), forwards=int(total["forwards"]),
               tpf=float(total["tokens"]) / max(1, total["forwards"]),
               tokens_per_second=float(total["tokens_per_second_excl_prefill"]),
               decode_seconds=decode_s, prefill_seconds=total["prefill_seconds"], compile_seconds=compile_s,
               token_ids=result.token_ids, **{k: v for k, v in extra.items()})
    if batch_size == 1:
        out["ms_per_forward"] = 1e3 * decode_s / max(1, steps)
    print(f"{method} batch {batch_size} shape {out['decode_shape']}: {out['tokens_per_second']:.1f} tok/s, TPF "
          f"{out['tpf']:.3f}" + (f", {out['ms_per_forward']:.2f} ms/forward" if "ms_per_forward" in out else "")
          + f" (compile + warm-up {compile_s:.0f} s)", flush=True)
    return out


def ar_speed(view, cfg, args, bandwidth, weight_bytes, batch: int) -> dict:
    prompts = random_prompts(cfg, args.repeats * batch, args.context, seed=batch)
    r = run_generate("ar", view, cfg, prompts, args, batch_size=batch)
    del r["token_ids"]
    # per step: the weights once, and each row's keys and values (the mean context over the decode)
    kv = batch * kv_bytes_per_slot(cfg) * (args.context + args.tokens / 2)
    bound = batch * bandwidth / (weight_bytes + kv) if bandwidth else None
    r.update(step_bytes=weight_bytes + kv, kv_bytes_per_step=kv, bound_tokens_per_second=bound,
             fraction_of_bound=r["tokens_per_second"] / bound if bound else None,
             ms_per_step=1e3 * batch / r["tokens_per_second"])
    if bound:
        print(f"  AR batch {batch}: {100 * r['fraction_of_bound']:.1f}% of the bound {bound:.0f} tok/s", flush=True)
    return r


class CompileClock:
    """measure_latency's progress hook: the seconds each size took to compile and warm up."""

    def __init__(self):
        self.seconds, self.size, self.start = {}, None, time.perf_counter()

    def set_postfix_str(self, text: str):
        self.size, self.start = text.split("=")[-1], time.perf_counter()

    def update(self):
        self.seconds[self.size] = time.perf_counter() - self.start
        print(f"  latency t={self.size}: compiled in {self.seconds[self.size]:.1f} s", flush=True)


def latency_curve(view, cfg, args) -> dict:
    from jf_jax.tuning.measure import measure_latency

    clock = CompileClock()
    curve = measure_latency(view, cfg, args.sizes, context=args.context, repeats=args.latency_repeats,
                            progress=clock)
    one = curve.seconds[0]
    for t, s in zip(curve.tokens, curve.seconds):
        print(f"  {t:>5} tokens: {1e3 * s:8.3f} ms ({s / one:.2f}x)", flush=True)
    return dict(context=args.context, tokens=list(curve.tokens), seconds=list(curve.seconds),
                relative=[s / one for s in curve.seconds], compile_seconds=clock.seconds)


def decoder_runs(view, cfg, args, padded: bool) -> dict:
    """ar / jacobi / mr on the same prompts; padded: every forward at the shape covering all three."""
    from jf_jax.decoding.shapes import covering, natural_shape

    n, K, p = args.block_size, args.num_blocks, args.pool_size
    mr = dict(block_size=n, num_blocks=K, pool_size=p)
    shape = covering([natural_shape("ar"), natural_shape("jacobi", n), natural_shape("mr", n, K, p)]) if padded \
        else None
    prompts = random_prompts(cfg, args.lossless_prompts, args.context, seed=7)
    methods = ([("ar", {})] if padded else []) + [("jacobi", dict(block_size=n)), ("mr", mr)]
    runs = {m: run_generate(m, view, cfg, prompts, args, shape=shape, **extra) for m, extra in methods}
    if padded:
        reference = runs["ar"]["token_ids"]
        for m in ("jacobi", "mr"):
            runs[m]["equal_to_ar"] = [a == b for a, b in zip(runs[m]["token_ids"], reference)]
            print(f"  {m} == AR at {shape}: {sum(runs[m]['equal_to_ar'])} of {len(reference)}", flush=True)
    for r in runs.values():
        r["token_ids"] = [ids[:16] for ids in r["token_ids"]]  # a glimpse; the comparison is above
    return dict(decode_shape=None if shape is None else str(shape), runs=runs)


def decode_main(args) -> int:
    cfg = named_config(args.config).replace(dtype="bfloat16", param_dtype="bfloat16")
    report = BudgetedReport.start(args.out / "decode.json", args.budget_s,
                                  skip=frozenset(args.skip.split(",")) if args.skip else frozenset(),
                                  command=" ".join(sys.argv), model=args.config, config=cfg.to_dict(),
                                  settings={k: str(v) for k, v in vars(args).items()})
    report.data["environment"] = report.run("environment", 0, environment)
    bw = report.run("bandwidth", 10, measure_bandwidth, args.bandwidth_mib)
    bandwidth = bw["bytes_per_second"] if bw else None
    if bw:
        print(f"bandwidth: {bandwidth / 1e12:.2f} TB/s ({bw['best']})", flush=True)
    built = report.run("model", 20, build_view, cfg, keep=lambda built: built[1])
    if built is None:
        return 1
    view, info = built
    report.run("ar_batch1", 40, ar_speed, view, cfg, args, bandwidth, info["step_weight_bytes"], 1)
    report.run("latency", 60, latency_curve, view, cfg, args)
    report.run(f"ar_batch{args.ar_batch}", 40, ar_speed, view, cfg, args, bandwidth, info["step_weight_bytes"],
               args.ar_batch)
    report.run("lossless_fixed_shape", 60, decoder_runs, view, cfg, args, True)
    report.run("decoders_natural_shape", 40, decoder_runs, view, cfg, args, False)
    report.data["memory_after"] = device_memory()
    report.save()
    print(f"wrote {report.path}")
    return 0
