"""One model's evaluation: its speed runs on every prompt set (``speed``), then the quality of its greedy AR answers
(``quality``), in one result dict, the unit ``report`` writes and a resumed report keeps; or one process's share
of them, the unit a multi-process run's parts hold (``parts``)."""

from __future__ import annotations

from jf_jax.eval.parts import Process, share
from jf_jax.eval.quality import gsm_accuracy, humaneval_answer_nll, humaneval_pass_at_1
from jf_jax.eval.speed import speed_of_set, speed_runs


def evaluate_model(spec: str, prompt_sets: dict[str, list[dict]], math_rows: list[dict], *, methods,
                   block_sizes: tuple[int, ...], max_new_tokens: int, math_max_new_tokens: int, num_blocks: int = 2,
                   seed: int = 0, math_batch: int = 10, humaneval: list[dict] | None = None,
                   humaneval_nll: list[dict] | None = None, humaneval_max_new_tokens: int = 384,
                   dtype: str = "float32", quality_dtype: str = "float32",
                   sampling=None, model=None, train_sets: tuple[str, ...] = (), decode_shape: str = "auto",
                   mesh=None, process: Process = Process()) -> dict:
    """Speed rows in ``dtype`` (every method against same-dtype AR: ``speedup_vs_ar`` is the ratio of tokens/s
    with the prefill, ``speedup_vs_ar_excl_prefill`` without), greedy or with ``sampling`` (a
    ``decoding.sampling.Sampling``; every method then samples AR's tokens for the seed); GSM8K and HumanEval
    accuracy of greedy AR in ``quality_dtype``. ``train_sets`` names the sets of ``prompt_sets`` the model trained
    on (recorded beside the results; the others are held out). ``humaneval`` problems are executed (pass@1),
    ``humaneval_nll`` problems scored by their canonical solutions' NLL. ``decode_shape`` ("auto", "off" or "RxW",
    ``api.run_shape``) is the one shape every speed run pads its forwards to; ``mesh`` spreads the speed runs over
    devices (``decoding.placement``). ``model``, when given, is ``spec`` already loaded in ``dtype``.
    One ``process`` of several evaluates its ``parts.share`` of every set (a score whose share is empty is None)
    and records the shares (``shares``: [first, count] per set), which ``parts.merge_results`` merges."""
    # The api is read at call time, not import time: the tests put a tiny model behind api.load_model.
    from jf_jax.api import encode_prompts, load_model, run_shape
    from jf_jax.decoding.sampling import GREEDY
    from jf_jax.decoding.shapes import shape_label

    runs = speed_runs(methods, block_sizes, num_blocks)
    shape = run_shape(decode_shape, [(run.method, run.options) for run in runs])
    sampling = sampling or GREEDY
    model = model or load_model(spec, dtype=dtype)
    result = dict(model=spec, name=model.name, source=model.source, dtype=dtype, quality_dtype=quality_dtype,
                  sampling=sampling.describe(), train_sets=list(train_sets), speed={}, math=None,
                  humaneval=None, humaneval_nll=None, decode_shape=shape_label(shape))
    set_shares = {name: share(len(rows), process) for name, rows in prompt_sets.items()}
    # The answers are decoded math_batch at a time: a share of whole batches decodes the one-process run's batches.
    quality_sets = dict(math=(math_rows, math_batch), humaneval=(humaneval or [], math_batch),
                        humaneval_nll=(humaneval_nll or [], 1))
    quality_shares = {key: share(len(rows), process, unit) for key, (rows, unit) in quality_sets.items()}
    for set_name, rows in prompt_sets.items():
        part = set_shares[set_name]
        if not part.count:
            continue
        ids = encode_prompts(model, [r["prompt"] for r in part.take(rows)])
        result["speed"][set_name] = speed_of_set(model, ids, runs, max_new_tokens=max_new_tokens, seed=seed,
                                                 sampling=sampling, decode_shape=shape, mesh=mesh,
                                                 first_index=part.first)
    math_rows, humaneval, humaneval_nll = (quality_shares[key].take(rows) for key, (rows, _) in quality_sets.items())
    if (math_rows or humaneval or humaneval_nll) and quality_dtype != dtype:
        model = load_model(spec, dtype=quality_dtype)
    if math_rows:
        result["math"] = gsm_accuracy(model, math_rows, max_new_tokens=math_max_new_tokens, batch=math_batch)
    if humaneval:
        result["humaneval"] = humaneval_pass_at_1(model, humaneval, max_new_tokens=humaneval_max_new_tokens,
                                                  batch=math_batch)
    if humaneval_nll:
        result["humaneval_nll"] = humaneval_answer_nll(model, humaneval_nll)
    if process.count > 1:
        result["shares"] = dict(speed={name: part.pair() for name, part in set_shares.items()},
                                **{key: part.pair() for key, part in quality_shares.items()})
    return result
