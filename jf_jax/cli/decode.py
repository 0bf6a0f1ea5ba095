"""``python -m jf_jax.decode``: decode prompts with one or more methods and benchmark them side by side.

Every method is timed the same way (after compilation, per prompt, with and without prefill) and compared
with the AR baseline measured in the same run. See ``--help`` and the README for the JSON schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jf_jax.cli.mesh import MeshSpec, build_mesh, mesh_error, parse_mesh, plain_layout
from jf_jax.cli.output_paths import file_problem
from jf_jax.data.prompt_files import gather_prompts
from jf_jax.decoding import stats
from jf_jax.eval import stats_table
from jf_jax.eval.stats_table import Column

# Methods with a step-by-step (python) driver that can stream accepted tokens.
STREAMING_METHODS = ("jacobi", "mr")

# Which CLI options each method takes (the rest of the methods ignore them).
CLI_BLOCK_SIZE = 8  # results/studies/decode_engine_speed/bench_engine.md; the paper's 64 is a GPU setting
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")
METHOD_OPTIONS = {
    "ar": SAMPLING_OPTIONS,
    "jacobi": ("block_size",) + SAMPLING_OPTIONS,
    "mr": ("block_size", "num_blocks", "spawn_ratio", "pool_size") + SAMPLING_OPTIONS,
}
# The defaults of the options that only some runs use: the parser's defaults are None, so that ``check_args`` can
# refuse an option given for a run that would ignore it, and fills these in afterwards.
DEFAULTS = dict(methods="ar,jacobi", max_new_tokens=128, block_size=CLI_BLOCK_SIZE, batch_size=1)
# The options a decoding run reads and ``--tune`` does not (it passes only --num-blocks, --spawn-ratio and --seed
# to the tuner's grid).
DECODE_ONLY_OPTIONS = ("methods", "max_new_tokens", "block_size", "pool_size", "batch_size", "temperature", "top_k",
                       "top_p", "stream", "json", "mesh")
TUNE_GRID_OPTIONS = ("num_blocks", "spawn_ratio", "seed")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax decode", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m",
                   help="smollm2-135m (embedded default), qwen2.5-coder-0.5b (after scripts/install.sh --qwen), a "
                   "Hugging Face directory, a .gguf file, or a training run directory")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", type=Path, help=".jsonl file with a 'prompt' field per line, or .txt, one per line")
    p.add_argument("--methods", help=f"comma list of decoding methods, e.g. ar,jacobi,mr (default "
                   f"{DEFAULTS['methods']})")
    p.add_argument("--max-new-tokens", type=int, help=f"default {DEFAULTS['max_new_tokens']}")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "int8"), default="auto",
                   help="auto (default: the fastest dtype shown lossless on this class of machine, "
                        "jf_jax.model.machine: bfloat16 on x86 CPUs with AVX2, float32 on GPUs and on CPUs where "
                        "nothing was shown, e.g. ARM; python -m jf_jax.doctor says which and why), bfloat16, "
                        "float32 (the reference) or int8 (W8A8 matmuls: a lossy approximation of the model, decoded "
                        "losslessly against its own int8 AR)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template")
    p.add_argument("--json", type=Path, help="write the runs and summary as JSON to this path")
    p.add_argument("--block-size", type=_int_or_tuned,
                   help=f"Jacobi block size n (default {CLI_BLOCK_SIZE}: in bf16 on a 2-core CPU a 16-token forward "
                        "costs 1.5-2.8x a one-token step, by CPU kind, an 8-token one less; results/studies/"
                        "decode_engine_speed), or 'tuned': this device's --tune choice")
    p.add_argument("--num-blocks", type=int, help="mr: blocks in flight K")
    p.add_argument("--spawn-ratio", type=float, help="mr: accepted fraction of the active block that spawns the next")
    p.add_argument("--pool-size", type=_int_or_tuned, help="mr: rejection-recycling verification size, or 'tuned'")
    p.add_argument("--seed", type=int, help="seed of the sampling noise and of the random draft initialisation "
                   "(two separate streams; default 0)")
    p.add_argument("--temperature", type=float, help="sample at this temperature (default 0: greedy); every "
                   "method gives the same tokens for the same --seed")
    p.add_argument("--top-k", type=int, help="sampling: keep the k most likely tokens (default 0: off)")
    p.add_argument("--top-p", type=float, help="sampling: keep the nucleus of this probability (default 1: off)")
    p.add_argument("--decode-shape", default="auto",
                   help="pad every decode forward to one shape, ROWSxWIDTH per prompt: 'auto' (on GPUs and TPUs the "
                        "smallest shape covering every method run, so every method's tokens go through the same "
                        "kernels: jacobi and mr gave AR's tokens on every prompt measured on an H100 and an H200, and "
                        "no TPU has run; off on CPUs, whose decode path is bit-invariant by construction), 'off', or "
                        "e.g. 4x32")
    p.add_argument("--mesh", type=parse_mesh,
                   help="spread decoding over devices: data=D,fsdp=F,tensor=T (rows over data x fsdp, heads, MLP "
                        "units and vocabulary over tensor; jf_jax.decoding.placement); unnamed axes are 1")
    p.add_argument("--batch-size", type=int,
                   help="decode this many prompts at a time in one program (every method; tokens as decoded alone; "
                        f"default {DEFAULTS['batch_size']})")
    p.add_argument("--stream", action="store_true",
                   help="print jacobi and mr tokens as they are accepted (runs them on the step-by-step driver)")
    p.add_argument("--tune", action="store_true",
                   help="hardware-aware configuration (jf_jax.tuning): measure the latency curve and a TPF grid, "
                   "write tuned.json + PNGs to --tune-out, and exit")
    p.add_argument("--tune-out", type=Path,
                   help="directory of the --tune outputs, read by --block-size/--pool-size tuned (default "
                        "$JF_JAX_CACHE/tune, else ~/.cache/jf_jax/tune)")
    return p


def _int_or_tuned(text: str):
    if text == "tuned":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'tuned', got {text!r}") from None


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def selected_methods(args) -> list[str]:
    methods = DEFAULTS["methods"] if args.methods is None else args.methods
    return [m.strip() for m in methods.split(",") if m.strip()]


def check_args(args) -> None:
    """Refuses, before anything is read or loaded, every option out of the range its decoder enforces and every
    option the run would ignore (one of a method that ``--methods`` does not run, a decoding option with
    ``--tune``, ``--tune-out`` with nothing tuned), then fills in ``DEFAULTS``. Raises a ValueError naming the
    option."""
    from jf_jax import api

    given = {name for name, value in vars(args).items() if value is not None and value is not False}
    if args.tune:
        unused = [name for name in DECODE_ONLY_OPTIONS if name in given]
        if unused:
            raise ValueError(f"--tune does not use {', '.join(map(flag, unused))}: it measures its own grid, given "
                             f"only {', '.join(map(flag, TUNE_GRID_OPTIONS))} (python -m jf_jax.cli.tune sets "
                             "every knob)")
    else:
        methods = selected_methods(args)
        unknown = [m for m in methods if m not in api.METHODS]
        if not methods or unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                             f"available: {', '.join(api.METHODS)}")
        users = {name: [m for m in api.METHODS if name in METHOD_OPTIONS.get(m, ())]
                 for name in set().union(*METHOD_OPTIONS.values())}
        users["stream"] = list(STREAMING_METHODS)
        unused = [f"{flag(name)} (only {'/'.join(users[name])})" for name in sorted(given & users.keys())
                  if not set(users[name]) & set(methods)]
        if unused:
            raise ValueError(f"--methods {','.join(methods)} does not use {', '.join(unused)}: drop the option or "
                             "add its method")
        if "tune_out" in given and "tuned" not in (args.block_size, args.pool_size):
            raise ValueError("--tune-out is only read by --tune and by --block-size/--pool-size tuned")
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.stream and args.batch_size > 1:
        raise ValueError("--stream prints one prompt at a time: it needs --batch-size 1")
    check_values(args)
    if not args.tune:
        decode_shape(args, backend="cpu")  # the value and, for RxW, that it covers every method
    problem = mesh_error(args.mesh, [args.model])  # devices and heads against the mesh, before any model loads
    if problem:
        raise ValueError(problem)


def decode_shape(args, backend: str | None = None):
    """``--decode-shape`` for the methods of ``args`` (``api.run_shape``); a ValueError names it."""
    from jf_jax.decoding.common import GenerationError
    from jf_jax.api import run_shape

    if "tuned" in (args.block_size, args.pool_size):
        return None  # checked again once the tuned values are known
    try:
        return run_shape(args.decode_shape, [(m, method_options(m, args)) for m in selected_methods(args)], backend)
    except GenerationError as e:
        raise ValueError(f"--decode-shape: {e}") from None


def check_values(args) -> None:
    """The numeric options against the limits their decoders enforce (``--block-size``/``--pool-size`` 'tuned'
    are checked once ``resolve_tuned`` has replaced them); a ValueError names the option."""
    from jf_jax.decoding.common import MAX_BATCH_SIZE, MAX_SEED, check_fraction, check_int
    from jf_jax.decoding.multiblock import MAX_NUM_BLOCKS, MAX_POOL_SIZE
    from jf_jax.decoding.runner import MAX_BLOCK_SIZE
    from jf_jax.decoding.sampling import Sampling

    limits = dict(batch_size=(1, MAX_BATCH_SIZE), block_size=(1, MAX_BLOCK_SIZE), num_blocks=(1, MAX_NUM_BLOCKS),
                  pool_size=(1, MAX_POOL_SIZE), seed=(0, MAX_SEED))
    for name, (low, high) in limits.items():
        value = getattr(args, name)
        if value is not None and value != "tuned":
            check_int(flag(name), value, low, high)
    if args.spawn_ratio is not None:
        check_fraction("--spawn-ratio", args.spawn_ratio)
    Sampling(**{k: v for k in ("temperature", "top_k", "top_p") if (v := getattr(args, k)) is not None})  # checks


def read_prompts(args) -> list[str]:
    return gather_prompts(args.prompt, args.prompts)


def method_options(method: str, args) -> dict:
    return {name: getattr(args, name) for name in METHOD_OPTIONS.get(method, ()) if getattr(args, name) is not None}


def summarize(runs: list[dict]) -> dict:
    """Per-method totals of the runs' statistics (``decoding.stats.summarize``) and speedups against AR. Batched
    runs share their call's wall clock (``seconds`` of every run of the method)."""
    summary = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        shared = {} if mine[0]["batch_size"] == 1 else dict(seconds=mine[0]["seconds"],
                                                             prefill_seconds=mine[0]["prefill_seconds"])
        summary[method] = stats.summarize([r["stats"] for r in mine], **shared)
    return stats.add_speedups(summary)


def check_writable(path: Path) -> None:
    """Fails before any work when the report could not be written (``output_paths.file_problem``)."""
    problem = file_problem(str(path))
    if problem:
        raise ValueError(f"cannot write the JSON report to {path}: {problem}")


def format_table(runs: list[dict], summary: dict) -> str:
    """Each run's statistics, then each method's summary (``eval.stats_table``: the schema's headers)."""
    per_run = [dict(r["stats"], method=r["method"], prompt_index=r["prompt_index"]) for r in runs]
    # A batched prompt's stats have no seconds of their own: its timing cells read "-".
    lines = [stats_table.render_table(per_run, ["method", Column("prompt_index", "prompt", "d"), "tokens",
                                                "forwards", "tpf", "seconds", "tokens_per_second",
                                                "tokens_per_second_excl_prefill"], markdown=False), "",
             stats_table.render_table([dict(s, method=m) for m, s in summary.items()],
                                      ["method", "tpf", "tokens_per_second", "tokens_per_second_excl_prefill",
                                       "speedup_vs_ar"], markdown=False)]
    batch = runs[0]["batch_size"] if runs else 1
    how = "prompt by prompt" if batch == 1 else f"{batch} prompts at a time (totals over the batches)"
    lines.append(f"(every method is timed after compilation, {how})")
    return "\n".join(lines)


def stream_printer(model, header: str):
    """An ``on_tokens`` callback that prints each newly accepted chunk of text to stdout as it arrives."""
    seen: list[int] = []
    print(header, end="", flush=True)

    def on_tokens(prompt_index: int, new_ids: list[int]) -> None:
        before = model.tokenizer.decode(seen)
        seen.extend(new_ids)
        print(model.tokenizer.decode(seen)[len(before):], end="", flush=True)

    return on_tokens


def run(args) -> dict:
    """Decodes the prompts with every method of ``args`` (a namespace that ``check_args`` has checked)."""
    from tqdm import tqdm

    from jf_jax import api

    methods = selected_methods(args)  # every option was checked by check_args
    prompts = read_prompts(args)
    if args.json is not None:
        check_writable(args.json)
    if "tuned" in (args.block_size, args.pool_size):
        from jf_jax.tuning.tuner import resolve_tuned

        args.block_size, args.pool_size = resolve_tuned(args.block_size, args.pool_size, args.tune_out)
        print(f"tuned configuration: block size {args.block_size}, pool size {args.pool_size}", file=sys.stderr)
        check_values(args)
    from jf_jax.decoding.shapes import shape_label

    environment = resolve_dtype(args)
    shape = decode_shape(args)
    environment["decode_shape"] = shape_label(shape)
    print(f"loading {args.model} ({args.dtype}) ...", file=sys.stderr)
    # On a mesh the weights keep the plain layout XLA can split (no CPU-kernel packing).
    model = api.load_model(args.model, dtype=args.dtype, **plain_layout(args.mesh))
    mesh = None if args.mesh is None else build_mesh(args.mesh, model.cfg)
    runs = []
    # Streamed text goes to the terminal as it arrives, so the progress bar (which redraws its line) is off.
    with tqdm(total=len(methods) * len(prompts), desc="decoding", unit="prompt", file=sys.stderr,
              disable=args.stream) as bar:
        for method in methods:
            options = method_options(method, args)
            if shape is not None:  # the one shape of every method's forwards (GPUs and TPUs by default)
                options["decode_shape"] = shape
            if mesh is not None:
                options["mesh"] = mesh
            if args.batch_size > 1:  # one call decodes every prompt, batch_size at a time
                bar.set_postfix_str(f"{method} x{len(prompts)}")
                completions = list(enumerate(api.generate(model, prompts, method=method, chat=not args.no_chat,
                                                          max_new_tokens=args.max_new_tokens,
                                                          batch_size=args.batch_size, **options)))
            else:
                completions = []
                for index, prompt in enumerate(prompts):
                    bar.set_postfix_str(f"{method} #{index}")
                    stream = args.stream and method in STREAMING_METHODS
                    extra = {}
                    if stream:
                        extra = dict(driver="python", on_tokens=stream_printer(model, f"[{method} #{index}] "))
                    (c,) = api.generate(model, [prompt], method=method, max_new_tokens=args.max_new_tokens,
                                        chat=not args.no_chat, first_index=index, **options, **extra)
                    if stream:
                        print(flush=True)
                    completions.append((index, c))
                    bar.update()
            for index, c in completions:
                runs.append({"method": method, "prompt_index": index, "prompt": c.prompt, "token_ids": c.token_ids,
                             "text": c.text, "new_tokens": c.new_tokens, "forwards": c.forwards,
                             "batch_size": c.batch_size, "seconds": c.seconds, "prefill_seconds": c.prefill_seconds,
                             "stats": c.stats})
            if args.batch_size > 1:
                bar.update(len(prompts))
    settings = {k: (str(v) if isinstance(v, (Path, MeshSpec)) else v) for k, v in vars(args).items()
                if k not in ("prompt", "prompts", "json")}
    return {"model": model.name, "settings": settings, "environment": environment, "runs": runs,
            "summary": summarize(runs)}


def resolve_dtype(args) -> dict:
    """Replaces ``args.dtype`` "auto" by this machine's choice (``model.machine.choose_dtype``), prints the engine
    lines of the header (the dtype, the path its matmuls take, the CPU's features) and returns the report's
    environment."""
    from jf_jax.model import machine

    here = machine.detect()
    choice = machine.choose_dtype(args.dtype, here)
    args.dtype = choice.dtype
    print(machine.header(here, choice), file=sys.stderr)
    return machine.environment(here, choice)


def run_tuner(args) -> int:
    """``--tune``: the tuner with the grid's defaults on this CLI's model, prompts and dtype (only the mr options
    given here change the grid; ``python -m jf_jax.cli.tune`` has every knob)."""
    from jf_jax.cli.tuning_run import tune_and_report
    from jf_jax.tuning.measure import TUNE_PROMPTS

    prompts = gather_prompts(args.prompt, args.prompts, limit_builtin=TUNE_PROMPTS)
    resolve_dtype(args)
    tune_and_report(args, prompts, command=" ".join(["python -m jf_jax.decode"] + sys.argv[1:]),
                    names=("num_blocks", "spawn_ratio", "seed"))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)  # before any prompt file is read or model loaded
        if args.tune:
            return run_tuner(args)
        report = run(args)
    except (ValueError, FileNotFoundError, OSError) as e:  # our errors are ValueErrors naming the problem
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in report["runs"]:
        if r["method"] == report["runs"][0]["method"]:
            text = r["text"].strip().replace("\n", "\n    ")
            print(f"[{r['prompt_index']}] {r['prompt']}\n    {text}\n")
    print(format_table(report["runs"], report["summary"]))
    if args.json is not None:  # its directory exists: check_writable made it before any work
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
