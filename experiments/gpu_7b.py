"""Qwen2.5-7B's shapes on one GPU: AR against the bandwidth bound, the forward-latency knee, lossless decoding at
the fixed decode shape, and the Jacobi Forcing train step's memory and time.

No package here ships 7B weights; speed and memory do not need trained values, so the weights are random
(initialised on the device, not the host) with Qwen2.5-7B's published config (``model.config.QWEN2P5_7B_HF_CONFIG``).
Two processes, so the train step starts with an empty device:

    python experiments/gpu_7b.py decode --out DIR [--budget-s 380]   # writes DIR/decode.json
    python experiments/gpu_7b.py train --out DIR [--budget-s 200]    # writes DIR/train.json
    python experiments/gpu_7b.py decode --config tiny --out /tmp/t   # CPU smoke test (train likewise)

``decode``, in order, each section skipped (and recorded so) when the budget cannot hold it:
(1) device bandwidth (``bench_gpu_decode.measure_bandwidth``); (2) the model, bf16, random on the device;
(3) AR (compiled driver, natural shapes) at batch 1 and batch ``--ar-batch``, ``--context``-token random prompts,
``--tokens`` new tokens, EOS off, prefill excluded, against the bound bandwidth / (weights + KV read per step);
(4) one cached forward's latency for ``--sizes`` tokens after ``--context`` slots (``tuning.measure_latency``,
interleaved repeats), with each size's compile time; (5) ar, jacobi (n) and mr (n, K, p) at the decode shape that
covers them, tokens compared with AR's; (6) the same jacobi and mr unpadded (their natural forwards' cost).

``train``: the recipe's loss (configs/recipe.yaml: KL from a frozen bf16 reference, consistency weight 20,
noise-conditioned mask) at bf16 compute, float32 parameters and AdamW state, remat per layer, on synthetic packed
trajectories (``bench_train_step.packed_batches``). Candidates from the recipe's batch down: each is lowered and
compiled ahead of time and its ``memory_analysis()`` read before anything is allocated; the first whose need fits
the device runs ``--steps`` steps (time per step, peak bytes in use, losses). Every number goes to the JSON as it
is measured, so a run stopped by its box keeps what it had.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_decode import TINY_CONFIG, environment, measure_bandwidth, one_line  # noqa: E402

GIB = 2**30


class Report:
    """A JSON file rewritten after every section, and a clock that says whether a section still fits."""

    def __init__(self, path: Path, budget_s: float, **header):
        self.path, self.deadline = path, time.monotonic() + budget_s
        self.data, self.skip = dict(header, sections={}), set()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self):
        self.path.write_text(json.dumps(self.data, indent=1, default=str))

    def run(self, name: str, need_s: float, fn, *args, keep=lambda result: result):
        """``fn(*args)``'s result (``keep`` of it) under ``sections[name]``; a skip or an error is one line there,
        never the end."""
        if name in self.skip:
            return None
        left = self.deadline - time.monotonic()
        if left < need_s:
            self.data["sections"][name] = dict(skipped=f"{left:.0f} s of the budget left, {need_s:.0f} s needed")
            print(f"{name}: skipped ({left:.0f} s left)", flush=True)
            self.save()
            return None
        start = time.monotonic()
        try:
            result = fn(*args)
            record = dict(result=keep(result))
        except Exception as e:  # noqa: BLE001  one section failing must not cost the others
            result, record = None, dict(error=one_line(e))
            print(f"{name}: error: {one_line(e)}", flush=True)
        record["section_seconds"] = time.monotonic() - start
        self.data["sections"][name] = record
        self.save()
        return result


def model_config(name: str, param_dtype: str, **changes):
    from jf_jax.model.config import QWEN2P5_7B_HF_CONFIG, from_hf_config

    base = TINY_CONFIG if name == "tiny" else from_hf_config(QWEN2P5_7B_HF_CONFIG)
    return base.replace(dtype="bfloat16", param_dtype=param_dtype, **changes)


def device_memory() -> dict:
    stats = jax.devices()[0].memory_stats() or {}
    return {k: stats[k] for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use") if k in stats}


def random_prompts(cfg, count: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, length).tolist() for _ in range(count)]


# ------------------------------------------------------------------------------------------------------------
# decode

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
    cfg = model_config(args.config, "bfloat16")
    report = Report(args.out / "decode.json", args.budget_s, command=" ".join(sys.argv), model=args.config,
                    config=cfg.to_dict(), settings={k: str(v) for k, v in vars(args).items()})
    report.skip = set(args.skip.split(",")) if args.skip else set()
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


# ------------------------------------------------------------------------------------------------------------
# train

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
    from bench_train_step import packed_batches, step_flops

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
    cfg = model_config(args.config, "float32", remat=True)
    report = Report(args.out / "train.json", args.budget_s, command=" ".join(sys.argv), model=args.config,
                    config=cfg.to_dict(), settings={k: str(v) for k, v in vars(args).items()})
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


# ------------------------------------------------------------------------------------------------------------
# report (any machine): the tuner's choice from the measured curve, and the tables

PAPER_SWEEP = dict(block_sizes=(16, 32, 64, 128), num_blocks=(1, 2, 3, 4), pool_sizes=(1, 2, 4))


def sections(*paths: Path) -> dict:
    """Every section that has a result, from the decode JSONs in order (a later file fills what an earlier skipped)."""
    out = {}
    for path in paths:
        for name, record in json.loads(path.read_text())["sections"].items():
            if "result" in record and name not in out:
                out[name] = record["result"]
    return out


def report_main(args) -> int:
    from jf_jax.model.config import ModelConfig
    from jf_jax.tuning import roofline, tuner
    from jf_jax.tuning.measure import cells_from_report

    decode_files = [args.out / name for name in ("decode.json", "decode_rest.json") if (args.out / name).exists()]
    found = sections(*decode_files)
    header = json.loads(decode_files[0].read_text())
    cfg = ModelConfig.from_dict(header["config"])
    lat = found["latency"]
    curve = roofline.MeasuredCurve(tuple(lat["tokens"]), tuple(lat["seconds"]))
    grid_report = json.loads(args.tpf_from.read_text())
    cells = cells_from_report(grid_report)
    block_sizes = sorted({c.block_size for c in cells})
    pool_sizes = sorted({c.pool_size for c in cells})
    analysed = tuner.analyse("qwen2.5-7b (random weights)", cfg, curve, cells, block_sizes=block_sizes,
                             pool_sizes=pool_sizes, context=lat["context"], measured_device="H200", dtype="bfloat16")
    tuned = dict(version=1, command=" ".join(sys.argv), model="qwen2.5-7b (random weights)", dtype="bfloat16",
                 grid=dict(grid_report["grid"], tpf_from=str(args.tpf_from)), model_config=cfg.to_dict(), **analysed)
    tuner.write_outputs(tuned, args.out / "tune")
    lines = [f"measured latency (H200, Qwen2.5-7B shapes, bf16, context {lat['context']}; per call):"]
    lines += [f"| {t} | {1e3 * s:.2f} ms | {r:.2f}x |"
              for t, s, r in zip(lat["tokens"], lat["seconds"], lat["relative"])]
    lines.append("forward cost over one token's, per (n, K): K*n tokens; recycling rows p*K*n (measured curve):")
    for n in PAPER_SWEEP["block_sizes"]:
        cells_text = []
        for K in PAPER_SWEEP["num_blocks"]:
            ratios = [float(curve([p * K * n])[0] / curve([1])[0]) for p in PAPER_SWEEP["pool_sizes"]]
            cells_text.append("/".join(f"{r:.2f}" for r in ratios))
        lines.append(f"| n={n} | " + " | ".join(cells_text) + " |")
    lines += tuner.summary_lines(tuned)
    text = "\n".join(lines)
    (args.out / "tables.txt").write_text(text + "\n")
    print(text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("decode", "train", "report"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", choices=("qwen2.5-7b", "tiny"), default="qwen2.5-7b")
    parser.add_argument("--budget-s", type=float, default=380.0, help="seconds this part may take")
    parser.add_argument("--bandwidth-mib", type=int, default=4096)
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens (the cache before decoding)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (EOS off)")
    parser.add_argument("--repeats", type=int, default=3, help="prompts (batches) timed for AR")
    parser.add_argument("--ar-batch", type=int, default=8)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--latency-repeats", type=int, default=10)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--lossless-prompts", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed train steps after the first")
    parser.add_argument("--row-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--train-block", type=int, default=16)
    parser.add_argument("--train-blocks", type=int, default=16)
    parser.add_argument("--train-need-s", type=float, default=60.0, help="budget a train candidate needs to start")
    parser.add_argument("--skip", default="", help="decode: comma list of sections not to run (a rerun's)")
    parser.add_argument("--compile-only", action="store_true",
                        help="train: the recipe's memory analysis only (e.g. XLA:CPU's, as a prediction)")
    parser.add_argument("--tpf-from", type=Path, default=Path("results/studies/tune/tuned.json"),
                        help="report: the TPF grid the tuner's choice uses (TPF does not depend on the hardware)")
    args = parser.parse_args(argv)
    return dict(decode=decode_main, train=train_main, report=report_main)[args.part](args)


if __name__ == "__main__":
    sys.exit(main())
