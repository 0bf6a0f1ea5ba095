"""OpenAI request bodies to checked ``GenerationRequest`` values, and OpenAI-style errors.

Everything a request can get wrong is found here, before it reaches the scheduler: malformed JSON (400), a field
of the wrong type (422), a value out of range or a feature this server does not have (400, naming the field), an
unknown model (404), a prompt longer than the context (413). A field the server does not implement is refused
unless it holds its neutral value (``n: 1``, ``logprobs: null``, ``presence_penalty: 0``...), so a client never
gets an answer computed without something it asked for.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Sequence

from jf_jax.decoding.common import MAX_SEED, GenerationError
from jf_jax.decoding.sampling import Sampling
from jf_jax.serving.batch import ServedMethod


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Served:
    """What a request is checked against: the server's model names, (method, block size) pairs and context."""

    model: str
    """The name /v1/models lists; ``aliases`` are accepted too (e.g. the --model spec as given)."""
    aliases: tuple[str, ...]
    methods: tuple[ServedMethod, ...]
    """The pairs served, the default (a request naming neither ``method`` nor ``block_size``) first."""
    block_size: int
    """The block size of a request that names a method but no ``block_size`` (--block-size)."""
    max_context: int
    vocab_size: int
    encode: Callable[[str], list[int]]
    """Text to token ids (the tokenizer, without a chat template)."""
    render_chat: Callable[[list[dict]], str] | None
    """Messages to the prompt text through the model's chat template (None: the model has none)."""


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One checked request, ready for the scheduler."""

    kind: str
    """"completion" or "chat"."""
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    seed: int
    method: ServedMethod
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


# Fields a client may send but this server does not implement, with the values that ask for nothing.
NEUTRAL: dict[str, tuple] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False), "top_logprobs": (None, 0),
    "suffix": (None, ""), "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": (None, False, True),
    "response_format": (None, {"type": "text"}), "top_k": (None,), "store": (None, False), "metadata": (None, {}),
    "service_tier": (None, "auto", "default"), "modalities": (None, ["text"]), "audio": (None,),
    "prediction": (None,), "reasoning_effort": (None,), "user": None,  # user: any string, ignored
}
COMMON = ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "method",
          "block_size", "return_token_ids")
FIELDS = {"completion": COMMON + ("prompt",), "chat": COMMON + ("messages", "max_completion_tokens")}
ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4


def _is_neutral(value, neutrals) -> bool:
    return any(value is None if n is None else type(value) is type(n) and value == n for n in neutrals)


def _typed(body: dict, name: str, types: tuple, what: str, default=None):
    """``body[name]`` checked against ``types`` (None allowed: the default); 422 naming the field otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise APIError(422, f"{name} must be {what}, got {type(value).__name__} {json.dumps(value)[:80]}", name,
                       "invalid_type")
    return value


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body (400 if it is not one)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None, "invalid_json")
    return body


def check_fields(body: dict, kind: str) -> None:
    """400 for a field this endpoint does not know, or a known feature asked for but not implemented here."""
    for name, value in body.items():
        if name in FIELDS[kind]:
            continue
        if name not in NEUTRAL:
            raise APIError(400, f"unknown or unsupported field {name!r}", name, "unsupported_field")
        if NEUTRAL[name] is not None and not _is_neutral(value, NEUTRAL[name]):
            raise APIError(400, f"{name}={json.dumps(value)[:80]} is not supported by this server (jf-jax serve "
                                f"generates one completion per request, without logprobs, penalties or tools)",
                           name, "unsupported_value")


def check_model(body: dict, served: Served) -> None:
    model = _typed(body, "model", (str,), "a string", served.model)
    if model != served.model and model not in served.aliases:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served.model!r}", "model",
                       "model_not_found")


def check_method(body: dict, served: Served) -> ServedMethod:
    """The pair the extension fields ``method`` and ``block_size`` name: ``method`` defaults to the default pair's,
    ``block_size`` to ``served.block_size`` (AR's is 1: it may only be 1 or absent). 400 for a pair not served,
    naming the field that leaves the served ones and listing them."""
    default = served.methods[0]
    method = _typed(body, "method", (str,), "a string", default.method)
    block = _typed(body, "block_size", (int,), "an integer")
    listed = ", ".join(m.describe() for m in served.methods)
    if method not in {m.method for m in served.methods}:
        raise APIError(400, f"method {method!r} is not served here; this server serves {listed} (jf-jax serve "
                            "--methods, --block-sizes)", "method", "unsupported_value")
    if method == "ar":
        if block not in (None, 1):
            raise APIError(400, f"block_size {block}: ar decodes one token per forward, so its block_size is 1 (or "
                                "absent)", "block_size", "invalid_value")
        return ServedMethod("ar", 1)
    block = served.block_size if block is None else block
    pair = next((m for m in served.methods if (m.method, m.block_size) == (method, block)), None)
    if pair is None:
        raise APIError(400, f"block_size {block} is not served with {method}; this server serves {listed} (jf-jax "
                            "serve --methods, --block-sizes)", "block_size", "unsupported_value")
    return pair


def chat_prompt(body: dict, served: Served) -> str:
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise APIError(422, "messages must be a list of messages", "messages", "invalid_type")
    if not messages:
        raise APIError(400, "messages must hold at least one message", "messages", "missing_field")
    clean = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(422, f"{where} must be an object with 'role' and 'content'", where, "invalid_type")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise APIError(400, f"{where} has unsupported keys {sorted(extra)} (tool calls are not supported)", where,
                           "unsupported_field")
        if m.get("role") not in ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {m.get('role')!r}", where,
                           "invalid_value")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"{where}.content: only text parts are supported", where, "unsupported_value")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(422, f"{where}.content must be a string or a list of text parts", where, "invalid_type")
        clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    if served.render_chat is None:
        raise APIError(400, "this model has no chat template: use /v1/completions", "messages", "unsupported_value")
    try:
        return served.render_chat(clean)
    except Exception as e:  # noqa: BLE001 (templates raise their own errors, e.g. on an unexpected role order)
        raise APIError(400, f"the model's chat template refused these messages: {e}", "messages",
                       "invalid_value") from None


def completion_prompt(body: dict, served: Served) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt is empty", "prompt", "invalid_value")
        return served.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < served.vocab_size for t in prompt):
            raise APIError(400, f"prompt has token ids outside the vocabulary [0, {served.vocab_size})", "prompt",
                           "invalid_value")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, "a list of several prompts is not supported: send one request per prompt", "prompt",
                       "unsupported_value")
    if prompt is None:
        raise APIError(400, "prompt is required", "prompt", "missing_field")
    raise APIError(422, "prompt must be a string or a list of token ids", "prompt", "invalid_type")


def check_length(prompt: Sequence[int], max_tokens: int | None, served: Served) -> int:
    """The request's max_tokens (default: what the context leaves); 413 / 400 when prompt or output do not fit."""
    room = served.max_context - len(prompt)
    if room < 1:
        raise APIError(413, f"the prompt has {len(prompt)} tokens; this server's context is {served.max_context} "
                            "tokens (prompt plus output; --max-context), so at most "
                            f"{served.max_context - 1} prompt tokens fit", "prompt", "context_length_exceeded")
    if max_tokens is None:
        return room
    if max_tokens < 1:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", "max_tokens", "invalid_value")
    if max_tokens > room:
        raise APIError(400, f"max_tokens={max_tokens} does not fit: the prompt has {len(prompt)} tokens and the "
                            f"context is {served.max_context}, so at most {room} new tokens", "max_tokens",
                       "context_length_exceeded")
    return max_tokens


def check_sampling(body: dict) -> tuple[Sampling, int | None]:
    temperature = _typed(body, "temperature", (int, float), "a number", 0.0)
    top_p = _typed(body, "top_p", (int, float), "a number", 1.0)
    if not math.isfinite(temperature) or not math.isfinite(top_p):
        raise APIError(400, "temperature and top_p must be finite numbers", "temperature", "invalid_value")
    try:
        sampling = Sampling(temperature=temperature, top_p=top_p)
    except GenerationError as e:
        raise APIError(400, str(e), "top_p" if "top_p" in str(e) else "temperature", "invalid_value") from None
    seed = _typed(body, "seed", (int,), "an integer")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise APIError(400, f"seed must be in [0, {MAX_SEED}], got {seed}", "seed", "invalid_value")
    return sampling, seed


def check_stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise APIError(422, "stop must be a string or a list of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOPS or not all(stops):
        raise APIError(400, f"stop takes at most {MAX_STOPS} non-empty strings", "stop", "invalid_value")
    return tuple(stops)


def parse_request(body: dict[str, Any], kind: str, served: Served, default_seed: int) -> GenerationRequest:
    """A checked ``GenerationRequest`` from a /v1/completions (``kind`` "completion") or /v1/chat/completions
    ("chat") body; ``default_seed`` seeds a sampled request that names none (OpenAI's unseeded sampling varies)."""
    check_fields(body, kind)
    check_model(body, served)
    method = check_method(body, served)
    stream = _typed(body, "stream", (bool,), "a boolean", False)
    options = _typed(body, "stream_options", (dict,), "an object", {})
    if set(options) - {"include_usage"}:
        raise APIError(400, f"stream_options: unsupported keys {sorted(set(options) - {'include_usage'})}",
                       "stream_options", "unsupported_field")
    include_usage = _typed(options, "include_usage", (bool,), "a boolean", False)
    return_ids = _typed(body, "return_token_ids", (bool,), "a boolean", False)
    sampling, seed = check_sampling(body)
    stop = check_stop(body)
    max_tokens = _typed(body, "max_tokens", (int,), "an integer")
    if kind == "chat":
        max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer", max_tokens)
        prompt = served.encode(chat_prompt(body, served))
    else:
        prompt = completion_prompt(body, served)
    max_tokens = check_length(prompt, max_tokens, served)
    if seed is None:  # greedy: the seed only draws the drafts, so 0 as in ``api.generate`` (reproducible speed)
        seed = 0 if sampling.is_greedy else default_seed
    return GenerationRequest(kind=kind, prompt=tuple(prompt), max_tokens=max_tokens, sampling=sampling,
                             seed=seed, method=method, stop=stop, stream=stream,
                             include_usage=include_usage, return_token_ids=return_ids)
