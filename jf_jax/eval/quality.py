"""Quality of a model's greedy AR answers: GSM8K exact-answer accuracy, HumanEval pass@1 by execution, and the
teacher-forced NLL of HumanEval's canonical solutions.

None of these is timed: the answers are decoded in batches, and the NLL needs one forward per problem and no
decoding at all. Each score is a pure function of its per-problem items (``gsm_summary``, ``humaneval_summary``,
``nll_summary``), so the parts of a multi-process evaluation merge into the one-process score (``eval.parts``).
"""

from __future__ import annotations

import functools
import statistics


def gsm_accuracy(model, rows: list[dict], *, max_new_tokens: int, batch: int) -> dict:
    """Greedy AR answers to GSM rows (each with ``id``, ``prompt`` and ``answer``), ``batch`` problems at a time,
    each scored by ``data.gsm.is_correct`` (last \\boxed{} / '####' / last number against the gold answer)."""
    from jf_jax.api import encode_prompts
    from jf_jax.data.gsm import extract_answer, is_correct
    from jf_jax.decoding.ar import generate_ar

    ids = encode_prompts(model, [r["prompt"] for r in rows])
    answers = []  # greedy AR, ``batch`` problems per batch (accuracy only: batching is not timed)
    for i in range(0, len(ids), batch):
        answers += generate_ar(model.params, model.cfg, ids[i:i + batch], max_new_tokens=max_new_tokens,
                               eos_ids=model.tokenizer.eos_ids, warmup=False).token_ids
    items = []
    for row, toks in zip(rows, answers):
        text = model.tokenizer.decode(toks)
        got = extract_answer(text)
        items.append(dict(id=row["id"], gold=row["answer"], extracted=None if got is None else str(got),
                          correct=is_correct(text, row["answer"]), text=text))
    return gsm_summary(items, max_new_tokens=max_new_tokens)


def gsm_summary(items: list[dict], *, max_new_tokens: int) -> dict:
    """GSM8K accuracy over scored answers (``gsm_accuracy``'s items), with the items."""
    return dict(problems=len(items), correct=sum(i["correct"] for i in items),
                accuracy=statistics.fmean(i["correct"] for i in items), max_new_tokens=max_new_tokens, items=items)


def humaneval_pass_at_1(model, problems: list[dict], *, max_new_tokens: int, batch: int) -> dict:
    """Greedy AR completions of HumanEval problems (``batch`` at a time), each executed against the problem's tests
    in a sandboxed subprocess (``eval.code_execution``): pass@1 with counts and every sample's outcome."""
    from jf_jax.api import generate
    from jf_jax.data.humaneval import humaneval_prompt
    from jf_jax.eval.code_execution import check_completion

    completions = generate(model, [humaneval_prompt(p) for p in problems], method="ar",
                           max_new_tokens=max_new_tokens, batch_size=batch)
    outcomes = [check_completion(p, c.text) for p, c in zip(problems, completions)]
    items = [dict(task_id=p["task_id"], status=o.status, detail=o.detail, text=c.text)
             for p, c, o in zip(problems, completions, outcomes)]
    return humaneval_summary(items, max_new_tokens=max_new_tokens)


def humaneval_summary(items: list[dict], *, max_new_tokens: int) -> dict:
    """pass@1 over executed completions (``humaneval_pass_at_1``'s items, each with its outcome's status), with
    the counts and the items."""
    from jf_jax.eval.code_execution import ExecutionResult, pass_at_1

    outcomes = [ExecutionResult(i["status"] == "passed", i["status"], i["detail"]) for i in items]
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
    return nll_summary(items)


def nll_summary(items: list[dict]) -> dict:
    """Nats per token over scored solutions (``humaneval_answer_nll``'s items), with the totals and the items."""
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
