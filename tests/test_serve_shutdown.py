"""SIGTERM to ``python -m jf_jax.serve``, as a process supervisor sends it: the server stops admitting, lets the
running and queued requests finish (or, past --drain-seconds, ends them with a clean error), and exits with status
0 within a bound, without a traceback.

The requests must still be decoding when the signal comes, so the model here is the tiny test model with a context
of 4096 positions and a prompt whose greedy answer runs 1500 tokens without EOS: seconds of decoding, against the
milliseconds between the first streamed chunk and the signal. The server has one slot, so a second request waits
in the queue behind the streamed one."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time

import pytest

from jf_jax import api
from tests.support.gguf_models import tiny_model, write_gguf
from tests.support.serve_server import serve_in_subprocess

PROMPT, LONG = "count 1 2 3 4 5 6 7 8 9", 1500  # greedy: 1500 tokens without EOS (checked below)
QUEUED = "hi there what is up today"
EXIT_BOUND_S = 120


@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("model") / "long.gguf",
                      tiny_model("llama", tie=True, seed=3, max_position_embeddings=4096))


@pytest.fixture(scope="module")
def answers(long_gguf):
    """Solo AR's token ids of the streamed and the queued request."""
    model = api.load_model(str(long_gguf))
    streamed, queued = (api.generate(model, [p], method="ar", max_new_tokens=LONG, chat=False,
                                     warmup=False)[0].token_ids for p in (PROMPT, QUEUED))
    assert len(streamed) == LONG and 2 not in streamed, "the streamed request must run long (no EOS)"
    return streamed, queued


def serve(long_gguf, drain_seconds: str):
    return serve_in_subprocess("--model", str(long_gguf), "--method", "ar", "--max-batch", "1", "--max-context",
                               "2048", "--min-prompt-bucket", "2048", "--dtype", "float32", "--drain-seconds",
                               drain_seconds, "--log-level", "warning")


def open_stream(client) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=EXIT_BOUND_S)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": PROMPT, "max_tokens": LONG, "stream": True,
                                                             "return_token_ids": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def events(resp, count: int | None = None) -> list:
    """The next ``count`` data payloads of a stream (all of them through ``[DONE]`` when None)."""
    out = []
    while count is None or len(out) < count:
        line = resp.readline()
        assert line, "the stream was cut before data: [DONE]"
        if line.startswith(b"data: "):
            payload = line[len(b"data: "):].strip().decode()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
            if payload == "[DONE]":
                break
    return out


def queue_one(client) -> tuple[threading.Thread, dict]:
    """A plain request that waits in the queue behind the stream (the one slot is taken); returns once it waits."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=client.post(
        "/v1/completions", {"prompt": QUEUED, "max_tokens": LONG, "return_token_ids": True},
        timeout=EXIT_BOUND_S)))
    thread.start()
    deadline = time.time() + 30
    while client.metric("queue_depth") < 1:
        assert time.time() < deadline, "the second request never reached the queue"
        time.sleep(0.02)
    return thread, result


def ids_of(chunks) -> list[int]:
    return [i for c in chunks if isinstance(c, dict) and c.get("choices") for i in c["choices"][0]["token_ids"]]


def exit_status_and_log(client) -> tuple[int, str]:
    status = client.process.wait(timeout=EXIT_BOUND_S)
    client.log.seek(0)
    return status, client.log.read()


def refused_after_signal(client) -> bool:
    """A request after the signal: the listener is closed, or the engine answers 503 "shutdown"."""
    try:
        status, _, r = client.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}, timeout=30)
    except OSError:  # refused or reset: the listener is closed
        return True
    return status == 503 and r["error"]["code"] == "shutdown"


def sigterm_mid_stream(gguf, drain_seconds: str, after_stream=lambda client: None):
    """A one-slot server streaming one answer with a plain request queued behind it, sent SIGTERM after the
    stream's first chunk: (the stream's payloads, the queued request's result, what ``after_stream(client)`` gave
    once the stream ended, the exit status, the server's log)."""
    with serve(gguf, drain_seconds) as client:
        conn, resp = open_stream(client)
        first = events(resp, 1)
        thread, result = queue_one(client)
        client.process.send_signal(signal.SIGTERM)
        rest = events(resp)
        conn.close()
        seen = after_stream(client)
        status, log = exit_status_and_log(client)
        thread.join(timeout=EXIT_BOUND_S)
    return first + rest, result, seen, status, log


def test_sigterm_drains_running_and_queued_requests_then_exits_0(long_gguf, answers):
    streamed, queued = answers
    chunks, result, refused, status, log = sigterm_mid_stream(long_gguf, "300", refused_after_signal)
    assert refused
    assert chunks[-1] == "[DONE]" and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert ids_of(chunks) == streamed  # the whole answer, solo AR's
    code, _, body = result["r"]
    assert code == 200 and body["choices"][0]["token_ids"] == queued  # the queued request was served too
    assert status == 0 and "Traceback" not in log, log[-3000:]
    assert "1 running and 1 queued requests have 300 s to finish" in log


def test_sigterm_past_the_drain_time_cancels_cleanly_then_exits_0(long_gguf, answers):
    streamed, _ = answers
    chunks, result, _, status, log = sigterm_mid_stream(long_gguf, "0")
    error = chunks[-2]["error"]  # the stream ends with an OpenAI error event, then data: [DONE]
    assert chunks[-1] == "[DONE]" and error["code"] == "shutdown" and error["type"] == "server_error"
    got = ids_of(chunks)
    assert 0 < len(got) < LONG and got == streamed[: len(got)]  # cut short; what was sent is solo AR's
    code, _, body = result["r"]
    assert code == 503 and body["error"]["code"] == "shutdown"  # the queued request: cancelled, not dropped
    assert status == 0 and "Traceback" not in log, log[-3000:]
