"""``python -m jf_jax.doctor``: what this machine gives jf-jax, in seconds.

The JAX backend and devices; on a CPU its model and the instruction-set features that decide decode speed;
whether jf-jax's CPU kernels run here (and if not, whether that is the CPU or a library to build); the path each
dtype's decode takes; the dtype ``--dtype auto`` picks and why; the XLA options of decode programs; and where
jacobi / mr == AR has been shown for this backend. ``--check`` also decodes a small random model greedily with
AR and jacobi in float32 and bfloat16 on this backend, and exits 1 unless their tokens are equal and a block's
logits have the bits of one-token steps at the decode shape a run takes here (padded on GPUs and TPUs): the
property the guarantee rests on, which a random model's tokens alone rarely expose. ``--measure`` times the
machine for the embedded model (or ``--model``) in the ``auto`` dtype: the read bandwidth and the AR bound it
sets, the cost of a cached forward of 1-32 tokens, and from it a block size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

CHECK_DTYPES = ("float32", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax doctor", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="also decode a small random model with AR and jacobi in float32 and bfloat16 here, and "
                        "fail (exit 1) unless their tokens are equal and a block's logits have the bits of one-token "
                        "steps (compiling takes about half a minute on two cores)")
    p.add_argument("--measure", action="store_true",
                   help="also measure this machine for a model in the auto dtype: read bandwidth, the bound it sets "
                        "on AR, the latency of a cached forward of 1-32 tokens, and a block size (a minute or two "
                        "on two cores)")
    p.add_argument("--model", default=None, help="the model --measure loads (default: the embedded SmolLM2-135M)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def report(machine) -> dict:
    """Everything the doctor says about ``machine`` (a ``jf_jax.model.machine.Machine``), as plain data."""
    import jax

    from jf_jax.model import decode_jit, machine as machines

    backend = machine.backend
    paths = {d: machines.engine_path(machine, d) for d in machines.DTYPES}
    auto = machines.choose_dtype("auto", machine)

    def kernels(runs: bool, reason: str | None, library: str | None) -> str:
        return ("run (library built and loaded)" if runs else
                f"cannot run here: {reason} (library: {library or 'built, not loaded'})" if reason
                else f"this CPU can run them, but: {library}")

    return {
        "jax": jax.__version__,
        "backend": backend,
        "devices": list(machine.devices),
        "cpu": {"model": machine.cpu_model or "unknown", "cores": machine.cores,
                "features": machine.features() or "unknown"},
        "avx512_kernels": kernels(machine.avx512_kernels_run, machine.avx512_machine_reason,
                                  machine.avx512_library_problem),
        "avx2_gemm": kernels(machine.avx2_gemm_runs, machine.avx2_machine_reason, machine.avx2_library_problem),
        "decode_paths": {d: {"summary": p.summary, "matmuls": p.matmuls, "attention": p.attention,
                             **({"note": p.note} if p.note else {})} for d, p in paths.items()},
        "auto": {"dtype": auto.dtype, "path": paths[auto.dtype].summary, "reason": auto.reason},
        "compiler_options": decode_jit.COMPILER_OPTIONS.get(backend, {}),
        "full_float32_matmuls": backend in decode_jit.FULL_PRECISION_BACKENDS,
        "lossless": {d: machines.lossless_evidence(machine, d) for d in machines.DTYPES},
        "evidence_class": machines.evidence_class(machine),
    }


def format_report(r: dict) -> str:
    cpu = r["cpu"]
    features = cpu["features"]
    if isinstance(features, dict):
        features = " ".join(f for f, present in features.items() if present) + "  (absent: " + (
            " ".join(f for f, present in features.items() if not present) or "none") + ")"
    options = r["compiler_options"]
    lines = [
        f"backend       {r['backend']} (jax {r['jax']}): {len(r['devices'])} device(s), {', '.join(r['devices'])}",
    ]
    if r["backend"] == "cpu":
        lines += [f"cpu           {cpu['model']}, {cpu['cores']} cores", f"features      {features}"]
    lines += [
        f"cpu kernels   AVX-512 set (bf16 GEMM, W8A8): {r['avx512_kernels']}",
        f"              AVX2 set (bf16 GEMM, attention, cache write): {r['avx2_gemm']}",
        "decode paths",
        *(f"  {d:<9}   {p['summary']}" + (f"\n              note: {p['note']}" if "note" in p else "")
          for d, p in r["decode_paths"].items()),
        f"attention     {' / '.join(dict.fromkeys(p['attention'] for p in r['decode_paths'].values()))}",
        f"--dtype auto  {r['auto']['dtype']} ({r['auto']['path']}): {r['auto']['reason']}",
        "xla options   " + (", ".join(f"{k}={v}" for k, v in options.items()) or "none") + " in every decode program"
        + (" (keeps reductions out of YNNPACK, so a token's logits have the same bits in a block as alone)"
           if options else "") + ("; float32 matmuls at full precision" if r["full_float32_matmuls"] else ""),
        "lossless (jacobi / mr tokens == AR tokens) on this backend",
        *(f"  {d:<9}   {text}" for d, text in r["lossless"].items()),
    ]
    if "check" in r:
        lines.append("check (a random model, greedy, on this backend)")
        for c in r["check"]:
            tokens = "jacobi == AR" if c["equal"] else f"jacobi != AR, first at {c['first_difference']}"
            at = f" (both at the decode shape {c['decode_shape']})" if c.get("decode_shape") else ""
            bits = (f"block logits bit-identical to one-token steps{at}" if c["block_logits_bit_identical"] else
                    f"block logits differ from one-token steps{at} by up to {c['block_logits_max_difference']:.3g}, "
                    "so equal tokens hold only away from near-ties")
            lines.append(f"  {c['dtype']:<9}   {tokens} ({c['tokens']} tokens, n = {c['block_size']}); {bits} "
                         f"[{c['seconds']:.0f} s]")
    if "speed" in r:
        lines += format_speed(r["speed"])
    return "\n".join(lines)


CHECK_SHAPE = dict(architecture="llama", vocab_size=512, hidden_size=576, intermediate_size=1536, num_layers=2,
                   num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                   max_position_embeddings=2048, attention_bias=False, tie_word_embeddings=False)
"""The check's random model: SmolLM2-135M's layer shapes, 2 layers and a vocabulary of 512, large enough for
XLA:CPU's size-dependent kernel choices. Untied, so that the greedy continuation wanders instead of repeating
the current token (a tied random model's largest logit is its input token's)."""


def check(machine, dtypes=CHECK_DTYPES, *, prompts: int = 2, prompt_length: int = 20, max_new_tokens: int = 32,
          block_size: int = 16, bit_samples: int = 6) -> list[dict]:
    """Per dtype, on a random model (``CHECK_SHAPE``) in the decode view ``load_model`` would build here: whether
    greedy AR and jacobi give equal tokens (the guarantee), and whether a block's logits have the bits of the
    same tokens' one-token steps (what the guarantee rests on; without it equality holds only away from
    near-ties), both forwards at the decode shape a run takes here (on a GPU each at its natural shape differs in
    the last bits: that is why runs there are padded), over ``bit_samples`` random prompts and blocks. (Without
    decode_jit's XLA option, XLA:CPU's YNNPACK reductions made a 16-token block differ in every float32 sample and
    in about one bfloat16 sample in three; at 8 tokens it did not show.)"""
    import jax
    import numpy as np

    from jf_jax import api
    from jf_jax.decoding.ar import generate_ar
    from jf_jax.decoding.jacobi import generate_jacobi
    from jf_jax.decoding.shapes import shape_label
    from jf_jax.model import machine as machines
    from jf_jax.model.config import ModelConfig
    from jf_jax.model.params import cast_params, init_params

    rng = np.random.default_rng(0)
    ids = [rng.integers(0, CHECK_SHAPE["vocab_size"], prompt_length).tolist() for _ in range(prompts)]
    results = []
    # The decode shape a decode run takes here by default (padded on GPUs and TPUs, decoding.shapes).
    shape = api.run_shape("auto", [("ar", {}), ("jacobi", dict(block_size=block_size))])
    for dtype in dtypes:
        started = time.perf_counter()
        cfg = ModelConfig(**CHECK_SHAPE, dtype=dtype)
        params = init_params(cfg, jax.random.PRNGKey(0))
        params = cast_params({**params, "embed": params["embed"] * 4.0}, cfg.compute_dtype)
        view = machines.decode_view_for(machine, dtype).build(params)  # the view jf_jax.api.load_model builds
        ar = generate_ar(view, cfg, ids, max_new_tokens=max_new_tokens, eos_ids=[], warmup=False,
                         decode_shape=shape).token_ids
        jacobi = generate_jacobi(view, cfg, ids, max_new_tokens=max_new_tokens, eos_ids=[], block_size=block_size,
                                 warmup=False, decode_shape=shape).token_ids
        differences = [{"prompt": i, "position": first_difference(a, j)} for i, (a, j) in enumerate(zip(ar, jacobi))
                       if a != j]
        bits = block_bits(view, cfg, [[rng.integers(0, cfg.vocab_size, n).tolist() for n in (prompt_length, block_size)]
                                      for _ in range(bit_samples)], shape)
        results.append({"dtype": dtype, "equal": not differences, "prompts": prompts, "tokens": sum(map(len, ar)),
                        "decode_shape": shape_label(shape),
                        "block_size": block_size, "first_difference": differences[0] if differences else None,
                        "block_logits_bit_identical": bits == 0.0, "block_logits_max_difference": bits,
                        "seconds": time.perf_counter() - started})
    return results


def block_bits(view, cfg, samples: list[list[list[int]]], shape=None) -> float:
    """The largest difference, over ``samples`` of (prompt, block), between the logits of a block computed in one
    forward (as jacobi does) and one token per forward (as AR does), with the prompt in the cache; 0.0 when every
    bit agrees. With a decode ``shape`` (``decoding.shapes.DecodeShape``) both forwards are padded to it, as every
    decode forward of a run at that shape is; without, each has its natural shape."""
    import jax.numpy as jnp
    import numpy as np

    from jf_jax.model.decode_jit import decode_jit
    from jf_jax.model.kv_cache import KVCache
    from jf_jax.model.transformer import forward, forward_shared_prefix, logits

    @decode_jit
    def prefill(view, tokens, cache):
        return forward(view, cfg, tokens, cache=cache)[1]

    @decode_jit
    def step(view, tokens, cache):  # tokens [1, t] -> their logits [1, t, V], the cache with them written
        if shape is None:
            hidden, cache = forward(view, cfg, tokens, cache=cache)
            return logits(view, cfg, hidden), cache
        t = tokens.shape[1]
        padded = jnp.zeros((shape.rows, shape.width), jnp.int32).at[0, :t].set(tokens[0])
        valid = jnp.zeros((shape.rows, shape.width), bool).at[0, :t].set(True)
        hidden, k, v, _ = forward_shared_prefix(view, cfg, padded, cache, valid=valid, whole_cache=True)
        # logits of every padded position, as decoding.shapes.fixed_forward computes them
        return logits(view, cfg, hidden)[:1, :t], cache.write(k[:, :1, :t], v[:, :1, :t])

    worst = 0.0
    for prompt, block in samples:
        width = 0 if shape is None else shape.width
        cache = prefill(view, jnp.asarray([prompt], jnp.int32),
                        KVCache.init(cfg, 1, 2 * (len(prompt) + len(block)) + width))
        cache = cache.commit(len(prompt))
        together, _ = step(view, jnp.asarray([block], jnp.int32), cache)
        alone = []
        for token in block:
            out, cache = step(view, jnp.asarray([[token]], jnp.int32), cache)
            alone.append(np.asarray(out[0, 0]))
            cache = cache.commit(1)
        worst = max(worst, float(np.max(np.abs(np.asarray(together[0]) - np.stack(alone)))))
    return worst


MEASURE_SIZES = (1, 2, 4, 8, 16, 32)
BLOCK_COST_LIMIT = 1.5
"""The recommended block (without a tuned choice) is the largest whose forward costs at most this many one-token
steps: jacobi at block size n beats AR only where it accepts more tokens per forward than that cost ratio."""


def measure(machine, spec: str | None = None, *, context: int = 256, repeats: int = 5) -> dict:
    """Times ``spec`` (default: the embedded model) on this machine in the dtype ``auto`` picks (``speed``)."""
    from jf_jax import api
    from jf_jax.model import machine as machines
    from jf_jax.tuning import measure as measuring

    spec = spec or api.DEFAULT_MODEL
    dtype = machines.choose_dtype("auto", machine).dtype
    model = api.load_model(spec, dtype=dtype)
    # Host read bandwidth bounds a CPU's decode step; an accelerator's step reads its own memory instead.
    bandwidth = measuring.read_bandwidth_gbs(threads=machine.cores) if machine.backend == "cpu" else None
    curve = measuring.measure_latency(model.params, model.cfg, MEASURE_SIZES, context=context, repeats=repeats)
    return speed(spec, dtype, dict(zip(curve.tokens, curve.seconds)), context=context,
                 repeats=repeats, bandwidth_gbs=bandwidth, weight_bytes=measuring.step_weight_bytes(model.params),
                 tuned_block_size=tuned_block_size())


def tuned_block_size() -> int | None:
    """This device's block size in the tuner's ``tuned.json`` (``python -m jf_jax.decode --tune``), if it ran."""
    from jf_jax.tuning import tuner

    try:
        return int(tuner.tuned_config()["block_size"])
    except (ValueError, KeyError, OSError):
        return None


def speed(model: str, dtype: str, seconds: dict[int, float], *, context: int, repeats: int,
          bandwidth_gbs: float | None, weight_bytes: int, tuned_block_size: int | None) -> dict:
    """The measured section of the report from median ``seconds`` per forward of t tokens (t = 1 among them)."""
    one = seconds[1]
    cost = {t: s / one for t, s in seconds.items()}
    bound = bandwidth_gbs * 1e9 / weight_bytes if bandwidth_gbs else None
    cheap = [t for t in seconds if t > 1 and cost[t] <= BLOCK_COST_LIMIT]
    if tuned_block_size is not None:
        block, why = tuned_block_size, "the tuner's choice for this device (tuned.json, python -m jf_jax.decode --tune)"
    elif cheap:
        block, why = max(cheap), (f"the largest measured block whose forward costs at most {BLOCK_COST_LIMIT}x a "
                                  "one-token step; jacobi gains where it accepts more tokens per forward than that "
                                  "cost (python -m jf_jax.decode --tune measures both for a model and prompts)")
    else:
        block, why = None, (f"every block of 2 or more tokens costs over {BLOCK_COST_LIMIT}x a one-token step here, "
                            "so parallel decoding gains only with a model that accepts more tokens per forward than "
                            "the costs above; python -m jf_jax.decode --tune measures that for a model and prompts")
    return {"model": model, "dtype": dtype, "context": context, "repeats": repeats,
            "latency_ms": {t: 1e3 * s for t, s in seconds.items()}, "cost_over_one_token": cost,
            "read_bandwidth_gbs": bandwidth_gbs, "step_weight_bytes": weight_bytes,
            "ar_bound_tokens_per_second": bound,
            "one_token_steps_per_second": 1 / one,
            "fraction_of_bound": (1 / one) / bound if bound else None,
            "block_size": block, "block_size_reason": why}


def format_speed(s: dict) -> list[str]:
    lines = [f"speed ({s['model']}, {s['dtype']}, cached forwards over {s['context']} tokens, medians of "
             f"{s['repeats']})"]
    if s["read_bandwidth_gbs"]:
        lines.append(f"  bandwidth   {s['read_bandwidth_gbs']:.1f} GB/s read; a one-token step reads "
                     f"{s['step_weight_bytes'] / 1e6:.0f} MB of weights, so AR is bound at "
                     f"{s['ar_bound_tokens_per_second']:.0f} tok/s; measured {s['one_token_steps_per_second']:.1f} "
                     f"steps/s ({s['fraction_of_bound']:.0%} of the bound)")
    lines.append("  forward     " + ", ".join(f"t={t} {ms:.1f} ms ({s['cost_over_one_token'][t]:.2f}x)"
                                              for t, ms in s["latency_ms"].items()))
    block = s["block_size"] if s["block_size"] is not None else "none"
    lines.append(f"  block size  {block}: {s['block_size_reason']}")
    return lines


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two different token lists differ (the shorter one's length if it is a prefix)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jf_jax.model import machine as machines

    here = machines.detect()
    r = report(here)
    try:
        if args.model and not args.measure:
            raise ValueError("--model names the model --measure times; add --measure")
        if args.measure:  # first: a model that does not load fails before the check's compiling
            r["speed"] = measure(here, args.model)
    except (ValueError, FileNotFoundError, OSError) as e:  # our errors are ValueErrors naming the problem
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        r["check"] = check(here)
    print(json.dumps(r, indent=1) if args.json else format_report(r))
    return 0 if all(c["equal"] and c["block_logits_bit_identical"] for c in r.get("check", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
