"""The batched trajectory recorder against the one-prompt recorder, side by side in one process: responses per
second of each, both timed after a warm pass over the same prompts (so every compiled shape exists), and whether
every block of every response recorded the same states.

    python experiments/bench_collect.py --dtype bfloat16 --prompts 8 --max-new-tokens 128 --batch-sizes 8,32 \\
        --json results/studies/batched_collection/bench_collect_avx2.json

Prompts: stdlib "write this function" tasks (``jf_jax.data.code_prompts.stdlib_tasks``, from the 100th on),
through SmolLM2's chat template; block size 16; every response's drafts keyed by its index.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np


def timed(fn):
    fn()  # the warm pass: compiles every shape these prompts need
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="8,32")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)

    from jf_jax.api import encode_prompts, load_model
    from jf_jax.data.code_prompts import stdlib_tasks
    from jf_jax.decoding.batch_recording import record_batch
    from jf_jax.decoding.recording import record_trajectories
    from jf_jax.model.machine import detect

    model = load_model("smollm2-135m", dtype=args.dtype)
    tasks = stdlib_tasks()[100: 100 + args.prompts]
    prompts = encode_prompts(model, [t.prompt for t in tasks], chat=True)
    eos = tuple(model.tokenizer.eos_ids)
    options = dict(block_size=16, max_new_tokens=args.max_new_tokens, eos_ids=eos)
    machine = detect()
    features = sorted((machine.cpu_flags or frozenset()) & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
    result = dict(dtype=args.dtype, prompts=args.prompts, max_new_tokens=args.max_new_tokens, block_size=16,
                  cpu=machine.cpu_model, cpu_features=features, python=platform.python_version(),
                  prompt_tokens=[len(q) for q in prompts])

    def sequential():
        return [record_trajectories(model.params, model.cfg, q, prompt_index=i, **options)
                for i, q in enumerate(prompts)]

    want, seconds = timed(sequential)
    result.update(sequential_seconds=seconds, sequential_responses_per_s=args.prompts / seconds,
                  response_tokens=int(sum(b.states.shape[1] for r in want for b in r)))
    for b in (int(x) for x in args.batch_sizes.split(",")):
        got, seconds = timed(lambda: record_batch(model.params, model.cfg, prompts, batch_size=b, **options))
        same = all(len(g.blocks) == len(w) and all(np.array_equal(x.states, y.states) for x, y in zip(g.blocks, w))
                   for g, w in zip(got, want))
        result[f"batch_{b}"] = dict(seconds=seconds, responses_per_s=args.prompts / seconds,
                                    vs_sequential=result["sequential_seconds"] / seconds, same_states=same,
                                    mismatched=sum(g.mismatched for g in got))
        print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
