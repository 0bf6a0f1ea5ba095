"""OpenAI response bodies: whole completions, server-sent-event chunks, usage.

Shapes follow OpenAI's /v1/completions ("text_completion") and /v1/chat/completions ("chat.completion" and
"chat.completion.chunk"). Two extensions, which OpenAI clients ignore: ``choices[0].token_ids`` when the request
set ``return_token_ids`` (the generated ids, EOS included as ``api.generate`` returns them), and a ``jf_jax`` object
on the final body or chunk with the method, block size and the forwards the request took.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

DONE = b"data: [DONE]\n\n"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a request ended."""

    finish_reason: str
    """"stop" (EOS or a stop string) or "length" (max_tokens)."""
    prompt_tokens: int
    token_ids: tuple[int, ...]
    forwards: int
    """Model forwards of this request's row, its prefill included."""
    method: str
    block_size: int

    def usage(self) -> dict:
        done = len(self.token_ids)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done}

    def stats(self) -> dict:
        tpf = len(self.token_ids) / self.forwards if self.forwards else 0.0
        return {"method": self.method, "block_size": self.block_size, "forwards": self.forwards,
                "tokens_per_forward": round(tpf, 4)}


@dataclasses.dataclass(frozen=True)
class Header:
    """What every body of one response repeats."""

    kind: str
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, kind: str, created: int, model: str) -> "Header":
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return cls(kind, f"{prefix}-{uuid.uuid4().hex[:24]}", created, model)

    def base(self, chunk: bool) -> dict:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def completion_body(h: Header, text: str, outcome: Outcome, with_ids: bool) -> dict:
    """The whole (non-streamed) response."""
    if h.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": outcome.finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
    if with_ids:
        choice["token_ids"] = list(outcome.token_ids)
    return {**h.base(False), "choices": [choice], "usage": outcome.usage(), "jf_jax": outcome.stats()}


def chunk_body(h: Header, text: str, finish_reason: str | None = None, token_ids=None, first: bool = False) -> dict:
    """One streamed chunk: new text (and ids, when asked for); ``first`` opens a chat message with its role."""
    if h.kind == "chat":
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text or not finish_reason
                                                                       else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return {**h.base(True), "choices": [choice]}


def final_chunk(h: Header, text: str, outcome: Outcome, token_ids=None) -> dict:
    """The chunk that carries the finish reason (and the last text, if any)."""
    return {**chunk_body(h, text, outcome.finish_reason, token_ids), "jf_jax": outcome.stats()}


def usage_chunk(h: Header, outcome: Outcome) -> dict:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {**h.base(True), "choices": [], "usage": outcome.usage()}


def sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
