"""The small public Python API: load a model from a SPEC, generate from text prompts with a chosen method.

    import jf_jax
    model = jf_jax.load_model("smollm2-135m")
    for c in jf_jax.generate(model, ["Write a haiku about JAX."], method="ar", max_new_tokens=64):
        print(c.text, c.new_tokens / c.seconds)

The CLI (``python -m jf_jax.decode``) is a thin layer over these functions.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Callable, Sequence

import jax

from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.common import GenerationError, GenerationResult
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.sampling import Sampling
from jf_jax.decoding.shapes import DecodeShape, default_decode_shape, natural_shape
from jf_jax.model import machine

DEFAULT_MODEL = "smollm2-135m"

# Every decoding method, imported directly: a decoder that fails to import fails ``import jf_jax`` loudly
# instead of silently vanishing from ``--methods``.
METHODS: dict[str, Callable[..., GenerationResult]] = {"ar": generate_ar, "jacobi": generate_jacobi, "mr": generate_mr}


def run_shape(choice: str, runs, backend: str | None = None) -> DecodeShape | None:
    """The decode shape (``decoding.shapes``) of a command's runs, ``runs`` being (method, options) pairs as passed
    to ``METHODS[method]``: ``choice`` "auto" (``shapes.default_decode_shape``: padded on GPUs and TPUs), "off"
    (None) or "RxW" (checked to cover every run). A GenerationError names a bad choice."""
    def option(method, options, name):
        return options.get(name, inspect.signature(METHODS[method]).parameters[name].default)

    natural = [natural_shape(method, *(option(method, options, name) for name in
                                       {"ar": (), "jacobi": ("block_size",),
                                        "mr": ("block_size", "num_blocks", "pool_size")}[method]))
               for method, options in runs]
    if choice == "off":
        return None
    if choice == "auto":
        return default_decode_shape(natural, backend)
    shape = DecodeShape.parse(choice)
    for (method, _), s in zip(runs, natural):
        shape.check_covers(method, s.rows, s.width)
    return shape


@dataclasses.dataclass(frozen=True)
class Completion:
    """One prompt's generation by one method."""

    method: str
    prompt: str
    token_ids: list[int]
    text: str
    forwards: int
    seconds: float
    prefill_seconds: float
    stats: dict
    """This prompt's statistics (``decoding.stats.prompt_stats``: TPF, tokens/s, iterations per block, ...)."""
    settings: dict
    """The method's settings (block size, batch size, driver, seed, ...)."""
    batch_size: int = 1
    """Prompts decoded together with this one; above 1, ``seconds`` and ``prefill_seconds`` are the wall clock of
    the whole call (every batch), shared by its prompts, and ``stats`` has no per-prompt timings."""

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


def default_column_shards() -> int:
    """Shards per matmul weight in this process's decode view (``model.machine.default_column_shards``)."""
    return machine.default_column_shards(jax.default_backend(), os.cpu_count() or 1)


def load_model(spec: str = DEFAULT_MODEL, dtype: str = "float32", column_shards: int | None = None):
    """Loads weights, config and tokenizer from ``spec``: "smollm2-135m", a HF directory or a .gguf file.

    The parameters are returned in the decoders' view (``model.decode_view.DecodeView``: layers unstacked,
    matmul weights split in ``column_shards`` shards, default one per CPU core); in bfloat16, when the
    ``cpu_kernels`` GEMM can run here and no ``column_shards`` are asked for, the matmul weights are packed for
    it instead. ``dtype="int8"`` quantises the matmul weights (per output channel) and each matmul's input (per
    row) to int8 over a bfloat16 model: a lossy approximation, decoded losslessly against its own AR.
    ``dtype="auto"`` takes the fastest dtype shown lossless on this machine (``model.machine.choose_dtype``).
    ``model.decode_view.stacked_params`` gives back the stacked training layout.
    """
    from jf_jax import weights  # deferred: it pulls in gguf / safetensors / orbax

    here = machine.detect()
    if dtype == "auto":
        dtype = machine.choose_dtype(dtype, here).dtype
    layout = machine.decode_view_for(here, dtype, column_shards)  # before loading: a wrong layout fails fast
    # int8: W8A8 matmuls (``model.quantize``), everything else in bfloat16
    loaded = weights.load(spec, dtype="bfloat16" if dtype == "int8" else dtype)
    return dataclasses.replace(loaded, params=layout.build(loaded.params))


def tune(spec: str, prompts: Sequence[str], *, dtype: str = "float32", chat: bool = True, **options) -> dict:
    """Hardware-aware configuration (``jf_jax.tuning.tuner.tune``) of the model ``spec`` on text ``prompts``:
    measures, chooses, writes ``tuned.json`` and plots under ``options["out_dir"]``; returns the report."""
    from jf_jax.tuning import tuner

    model = load_model(spec, dtype=dtype)
    return tuner.tune(model, encode_prompts(model, prompts, chat), chat=chat, dtype=dtype, **options)


def encode_prompts(model, prompts: Sequence[str], chat: bool = True) -> list[list[int]]:
    """Token ids of each prompt, through the model's chat template unless ``chat`` is False."""
    tok = model.tokenizer
    if isinstance(prompts, str):
        prompts = [prompts]
    encoded = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt.strip():
            raise GenerationError(f"prompt {i} is empty")
        text = tok.apply_chat_template(prompt, add_generation_prompt=True) if chat else prompt
        encoded.append(tok.encode(text))
    return encoded


def generate(model, prompts: Sequence[str] | str, *, method: str = "ar", max_new_tokens: int = 128,
             chat: bool = True, batch_size: int | None = None, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, first_index: int = 0, **options) -> list[Completion]:
    """Generation of each prompt with ``method`` (one of ``METHODS``). By default one prompt at a time, so that
    each prompt's timing is its own; with ``batch_size`` B, B prompts at a time in one compiled program (every
    method: each row keeps its own blocks and stop, and its tokens are those it gets alone).

    Greedy by default; ``temperature`` > 0 samples (after the ``top_k`` / ``top_p`` filters) with noise keyed by
    (``seed``, prompt index, position) (``jf_jax.decoding.sampling``), so every method gives the same tokens for
    the same seed. ``seed`` also seeds jacobi / mr drafts (a separate stream). ``first_index`` is the index of
    ``prompts[0]`` in a request split over several calls (keys follow the request's indices). ``options`` go to
    the method (e.g. block_size for "jacobi")."""
    if method not in METHODS:
        raise GenerationError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    options = dict(options, sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p), seed=seed,
                   first_index=first_index)
    if isinstance(prompts, str):
        prompts = [prompts]
    decode = METHODS[method]
    encoded = encode_prompts(model, prompts, chat)
    result = decode(model.params, model.cfg, encoded, max_new_tokens=max_new_tokens, eos_ids=model.tokenizer.eos_ids,
                    batch_size=1 if batch_size is None else batch_size, **options)
    settings = {k: v for k, v in result.stats.items() if k not in ("per_prompt", "total")}
    completions = []
    for i, (prompt, tokens, stats) in enumerate(zip(prompts, result.token_ids, result.stats["per_prompt"])):
        alone = "seconds" in stats  # batch size 1: the prompt's own wall clock
        completions.append(Completion(
            method=method, prompt=prompt, token_ids=tokens, text=model.tokenizer.decode(tokens),
            forwards=result.forwards[i], seconds=stats["seconds"] if alone else result.seconds,
            prefill_seconds=stats["prefill_seconds"] if alone else result.prefill_seconds, stats=stats,
            settings=settings, batch_size=settings["batch_size"]))
    return completions
