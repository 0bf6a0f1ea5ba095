"""``jf-jax serve`` end to end: a live server (uvicorn on 127.0.0.1, a free port) with continuous batching and Jacobi
decoding inside, driven by concurrent clients; every answer must be what ``api.generate`` gives its prompt alone with
AR (greedy, and sampled with the same seed), whatever shared the batch and whenever it arrived."""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import threading
import time

import pytest

from jf_jax import api
from jf_jax.decoding.sampling import Sampling
from jf_jax.serving.batch import BatchConfig
from jf_jax.serving.command import build
from jf_jax.serving.engine import EngineConfig
from jf_jax.serving.text import tokens_through_stop
from tests.conftest import require
from tests.support.serve_server import serve_in_subprocess, serve_in_thread

SAMPLED = Sampling(temperature=0.8, top_p=0.9)  # compiled at warm-up beside greedy
# Prompts of 17-27 tokens and max_tokens of 17-32: solo runs share one program (prompt and output buckets of 32),
# while the server prefills every prompt at its one bucket of 128 and holds 192 KV slots per row: shapes that differ
# from a solo run's, on which the answers must not depend.
CONTEXT = 100
BUCKET = 128


@pytest.fixture(scope="module")
def model(tiny_gguf):
    return api.load_model(str(tiny_gguf))


@pytest.fixture(scope="module")
def server(model, tiny_gguf):
    config = EngineConfig(batch=BatchConfig(method="jacobi", block_size=4, max_batch=3, max_context=CONTEXT,
                                            min_prompt_bucket=BUCKET),
                          max_queue=16, max_sampling=2, warm_sampling=(SAMPLED,))
    engine, app = build(model, str(tiny_gguf), config, name="tiny")
    for kind, prompt, max_tokens, sampling, seed, _ in CASES + EXTRA:  # while the engine warms up in its threads
        solo(model, kind, prompt, max_tokens, sampling, seed or 0)
    with serve_in_thread(engine, app) as client:
        client.engine = engine
        yield client


_solo_cache = {}


def solo(model, kind, prompt, max_tokens, sampling=None, seed=0):
    """(token ids, text) of AR decoding of ``prompt`` alone: the ground truth of every answer."""
    key = (kind, prompt, max_tokens, sampling, seed)
    if key not in _solo_cache:
        s = sampling or Sampling()
        c = api.generate(model, [prompt], method="ar", max_new_tokens=max_tokens, chat=kind == "chat",
                         temperature=s.temperature, top_p=s.top_p, seed=seed, warmup=False)[0]
        _solo_cache[key] = (c.token_ids, c.text)
    return _solo_cache[key]


def body(kind, prompt, max_tokens, sampling=None, seed=None, **extra):
    b = {"model": "tiny", "max_tokens": max_tokens, "return_token_ids": True, **extra}
    b.update({"messages": [{"role": "user", "content": prompt}]} if kind == "chat" else {"prompt": prompt})
    if sampling is not None:
        b.update(temperature=sampling.temperature, top_p=sampling.top_p)
    if seed is not None:
        b["seed"] = seed
    return b


def path(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def ask(client, kind, b, stream):
    """(text, token ids, finish reason) of one request, streamed or not."""
    if not stream:
        status, _, r = client.post(path(kind), b)
        assert status == 200, r
        choice = r["choices"][0]
        text = choice["message"]["content"] if kind == "chat" else choice["text"]
        assert r["usage"]["completion_tokens"] == len(choice["token_ids"])
        return text, choice["token_ids"], choice["finish_reason"]
    events = client.stream(path(kind), b)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") if kind == "chat" else c["choices"][0]["text"]
                   for c in chunks)
    ids = [i for c in chunks for i in c["choices"][0].get("token_ids", [])]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    return text, ids, chunks[-1]["choices"][0]["finish_reason"]


def finish(model, ids) -> str:
    """The finish reason of a response whose tokens are ``ids`` (EOS: "stop"; else max_tokens: "length")."""
    return "stop" if ids[-1] in model.tokenizer.eos_ids else "length"


def wait_idle(client, timeout=10.0):
    deadline = time.time() + timeout
    while client.metric("running_requests") or client.metric("queue_depth"):
        assert time.time() < deadline, "the batch did not empty"
        time.sleep(0.05)


# (kind, prompt, max_tokens, sampling, seed, stream): more requests than the 3 slots, mixed lanes and endpoints
CASES = [("completion", "hello hello hello hello", 30, None, None, False),
         ("chat", "hi there", 24, SAMPLED, 11, True),
         ("completion", "count 1 2 3 4 5 6 7 8 9", 32, SAMPLED, 3, False),
         ("chat", "abc abc abc abc", 20, None, None, True),
         ("completion", "zz top zz top zz top zz", 32, SAMPLED, 7, True),
         ("chat", "hello", 25, SAMPLED, 5, False),
         ("completion", "abc abc abc abc abc abc", 28, SAMPLED, 9, True),
         ("completion", "hi there what is up today", 17, None, 4, True)]


EXTRA = [("chat", "count 1 2 3", 32, SAMPLED, 21, False)]  # the other solo runs of this file


def staggered(server, cases, timeout: float, send=None) -> dict:
    """Each case (kind, prompt, max_tokens, sampling, seed, stream[, extra body fields, ...]) sent by ``send``
    (``ask`` by default) from a thread of its own, case i 0.03 i s after the first: some join a running batch, some
    wait for a slot. Answers by index."""
    send = send or ask
    results = {}

    def client(i, case):
        time.sleep(0.03 * i)
        kind, prompt, max_tokens, sampling, seed, stream, *rest = case
        fields = rest[0] if rest else {}
        results[i] = send(server, kind, body(kind, prompt, max_tokens, sampling, seed, **fields), stream)

    threads = [threading.Thread(target=client, args=(i, c)) for i, c in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return results


def test_concurrent_staggered_requests_get_solo_ar_tokens(server, model):
    engine = server.engine
    lanes_seen = []
    step = engine._step

    def spy():  # how many sampling lanes each step of the batch ran; slowed so that the requests overlap
        (group,) = engine.groups.values()
        lanes_seen.append(len({h.request.sampling for h in group.slots if h is not None}))
        time.sleep(0.01)
        step()

    engine._step = spy
    try:
        results = staggered(server, CASES, timeout=120)
    finally:
        del engine._step
    assert len(results) == len(CASES)
    for i, (kind, prompt, max_tokens, sampling, seed, _) in enumerate(CASES):
        ids, text = solo(model, kind, prompt, max_tokens, sampling, seed or 0)
        assert results[i][:2] == (text, ids), CASES[i]
        assert results[i][2] == finish(model, ids)
    assert max(lanes_seen) == 2  # greedy and sampled rows shared steps of the batch
    wait_idle(server)
    assert server.metric("batch_occupancy") == 0
    assert server.metric("compilations_after_warmup_total") == 0  # fixed shapes: nothing compiled per request
    assert server.metric("requests_total", '{outcome="ok"}') >= len(CASES)
    assert server.metric("tokens_per_forward") > 0


def test_stream_shape_and_stop_strings(server, model):
    ids, text = solo(model, "chat", "count 1 2 3", 32, SAMPLED, 21)
    assert len(text) >= 6
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = text[: text.find(stop)]
    b = body("chat", "count 1 2 3", 32, SAMPLED, 21, stop=[stop, "never-there"],
             stream_options={"include_usage": True})
    events = server.stream("/v1/chat/completions", b)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[0]["object"] == "chat.completion.chunk" and events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] > 0
    final = events[-3]
    assert final["choices"][0]["finish_reason"] == "stop" and final["jf_jax"]["method"] == "jacobi"
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    kept = ids[: tokens_through_stop(model.tokenizer.decode, ids, [stop])]
    assert streamed == cut and usage["usage"]["completion_tokens"] == len(kept)
    assert ask(server, "chat", b, stream=False) == (cut, kept, "stop")


def test_the_openai_client_works(server, model):
    openai = require("openai")
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    ids, text = solo(model, "completion", "hello hello hello hello", 30)
    r = client.completions.create(model="tiny", prompt="hello hello hello hello", max_tokens=30)
    assert r.choices[0].text == text and r.usage.completion_tokens == len(ids)
    ids, text = solo(model, "chat", "hi there", 24, SAMPLED, 11)
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi there"}],
                                                 max_tokens=24, temperature=0.8, top_p=0.9, seed=11, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi there"}],
                                       max_tokens=24, temperature=0.8, top_p=0.9, seed=11)
    assert r.choices[0].message.content == text and r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="'n'|n=2"):
        client.completions.create(model="tiny", prompt="hello", max_tokens=4, n=2)


LONG = "a" * CONTEXT  # as many tokens: no room for one more
BAD = [  # (path, body or raw bytes, status, param)
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 422, "max_tokens"),
    ("/v1/completions", {"prompt": 5}, 422, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 422, "stream"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("/v1/completions", {"prompt": LONG}, 413, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": CONTEXT - 1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": 1, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "seed": -3}, 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 99]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ("/v1/completions", {"prompt": "hi", "method": "mr"}, 400, "method"),
    ("/v1/completions", {"prompt": "hi", "block_size": 16}, 400, "block_size"),
    ("/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "temperature": 0.3}, 400, "temperature"),  # a third lane: over the cap
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400, "logprobs"),
]


@pytest.mark.parametrize("where, payload, status, param", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_errors_before_decoding(server, where, payload, status, param):
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    got, _, r = server.post(where, raw=raw)
    assert got == status, r
    assert set(r["error"]) == {"message", "type", "param", "code"} and r["error"]["message"]
    assert r["error"]["param"] == param


def test_other_routes(server):
    status, _, r = server.get("/v1/nothing")
    assert status == 404 and "error" in r
    assert server.get("/health")[:3:2] == (200, {"status": "ok"})
    status, _, r = server.get("/v1/models")
    assert r["data"][0]["id"] == "tiny" and r["data"][0]["max_model_len"] == CONTEXT


def test_a_full_queue_answers_429(server):
    engine = server.engine
    config = engine.config
    engine.config = dataclasses.replace(config, max_queue=0)
    try:
        status, headers, r = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 4})
    finally:
        engine.config = config
    assert status == 429 and headers["retry-after"] == "1" and r["error"]["code"] == "queue_full"


def cancelled(client) -> float:
    try:
        return client.metric("requests_total", '{outcome="cancelled"}')
    except KeyError:
        return 0


def test_a_client_that_disconnects_frees_its_slot(server):
    engine = server.engine
    step = engine._step
    engine._step = lambda: (time.sleep(0.05), step())  # slow steps: the request is still running when dropped
    try:
        before = cancelled(server)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps(body("completion", "zz top zz top zz top zz", 32,
                                                                     SAMPLED, 7, stream=True)))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        assert server.metric("running_requests") == 1
        conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
        resp.close()
        conn.close()
        wait_idle(server)
        assert server.metric("batch_occupancy") == 0 and cancelled(server) == before + 1
    finally:
        del engine._step


def test_a_failing_request_does_not_take_the_server_down(server, model):
    engine = server.engine
    prefill = engine._prefill

    def broken(lane, prompt, max_new, seed):
        if seed == 666:
            raise RuntimeError("injected prefill failure")
        return prefill(lane, prompt, max_new, seed)

    engine._prefill = broken
    try:
        status, _, r = server.post("/v1/completions", body("completion", "hello hello hello hello", 30, seed=666))
    finally:
        del engine._prefill
    assert status == 500 and "injected" in r["error"]["message"] and r["error"]["type"] == "server_error"
    assert server.get("/health")[0] == 200

    def broken_step():  # a whole step fails once: its requests get 500, the batch state is rebuilt
        del engine._step
        raise RuntimeError("injected step failure")

    engine._step = broken_step
    status, _, r = server.post("/v1/completions", body("completion", "hello hello hello hello", 30))
    assert status == 500 and "injected step failure" in r["error"]["message"]
    assert server.get("/health")[0] == 200
    ids, text = solo(model, "completion", "hello hello hello hello", 30)
    assert ask(server, "completion", body("completion", "hello hello hello hello", 30), stream=True) == (
        text, ids, finish(model, ids))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "mr"])
def test_the_command_serves_from_a_subprocess(tiny_gguf, model, method):
    """``python -m jf_jax.serve`` itself: options, warm-up, /health, concurrent requests answered with solo AR's
    tokens, a sampling setting compiled on first use (in the background) and one setting too many refused."""
    with serve_in_subprocess("--model", str(tiny_gguf), "--method", method, "--block-size", "3", "--max-batch", "2",
                             "--max-context", str(CONTEXT), "--dtype", "float32", "--max-sampling", "2",
                             "--log-level", "warning") as client:
        assert client.get("/v1/models")[2]["data"][0]["method"] == method
        cases = [c for c in CASES if c[3] is None][:2] + [c for c in CASES if c[3] is not None][:2]
        cases.insert(1, ("completion", "abc abc abc abc abc abc", 1, SAMPLED, 2, False))  # done at its prefill (AR)
        results = {}

        def run(i, case):
            time.sleep(0.05 * i)
            kind, prompt, max_tokens, sampling, seed, stream = case
            results[i] = ask(client, kind, body(kind, prompt, max_tokens, sampling, seed), stream)

        threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(cases)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        for i, (kind, prompt, max_tokens, sampling, seed, _) in enumerate(cases):
            ids, text = solo(model, kind, prompt, max_tokens, sampling, seed or 0)
            assert results[i] == (text, ids, finish(model, ids)), cases[i]
        assert client.metric("sampling_lanes") == 2
        status, _, r = client.post("/v1/completions", {"prompt": "hi", "temperature": 0.5, "max_tokens": 4})
        assert status == 400 and "--max-sampling" in r["error"]["message"]
        wait_idle(client)


@pytest.mark.slow
def test_the_embedded_smollm2_is_served_losslessly(smollm2):
    """The default model (no --model): concurrent chat requests, greedy and sampled, arriving while others decode,
    each answered with the tokens of AR decoding its prompt alone (the server prefills at a 128-token bucket and
    sizes its cache for 256 tokens; a solo run uses 64 and less)."""
    prompts = [("Write a haiku about JAX.", None, None), ("What is 17 times 3?", SAMPLED, 5),
               ("Name three colors.", None, None), ("Tell me a fact about the moon.", SAMPLED, 8)]
    with serve_in_subprocess("--dtype", "float32", "--max-batch", "3", "--max-context", "256",
                             "--min-prompt-bucket", "128", "--sampling", "0.8:0.9", "--log-level", "warning") as client:
        results = {}

        def run(i, prompt, sampling, seed):
            time.sleep(0.4 * i)
            b = body("chat", prompt, 24, sampling, seed, model="smollm2-135m")
            results[i] = ask(client, "chat", b, stream=i % 2 == 0)

        threads = [threading.Thread(target=run, args=(i, *p)) for i, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        for i, (prompt, sampling, seed) in enumerate(prompts):
            ids, text = solo(smollm2, "chat", prompt, 24, sampling, seed or 0)
            assert results[i] == (text, ids, finish(smollm2, ids)), prompt
        assert client.metric("compilations_after_warmup_total") == 0
