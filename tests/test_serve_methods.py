"""A server of several (method, block size) pairs: requests pick one with the extension fields ``method`` and
``block_size``, each pair decodes in a batch of its own, and every answer is still what ``api.generate`` gives its
prompt alone with AR, whatever ran in the same or in the other batches and whenever it arrived."""

from __future__ import annotations

import time

import pytest

from jf_jax import api
from jf_jax.serving.batch import BatchConfig, ServedMethod
from jf_jax.serving.command import build
from jf_jax.serving.engine import EngineConfig
from tests.support.serve_server import serve_in_thread
from tests.test_serve import BUCKET, CONTEXT, SAMPLED, finish, path, solo, staggered, wait_idle

DEFAULT = ServedMethod("jacobi", 4)
PAIRS = (ServedMethod("ar", 1), ServedMethod("jacobi", 2), ServedMethod("mr", 3))
# (kind, prompt, max_tokens, sampling, seed, stream, extension fields, the pair they name): more requests per pair
# than its 2 slots for mr, greedy and sampled rows in every batch, each pair named in every way a client can
MIXED = [("completion", "hello hello hello hello", 30, None, None, False, {}, DEFAULT),
         ("chat", "hi there", 24, SAMPLED, 11, True, {"method": "ar"}, PAIRS[0]),
         ("completion", "count 1 2 3 4 5 6 7 8 9", 32, SAMPLED, 3, False, {"method": "mr", "block_size": 3}, PAIRS[2]),
         ("chat", "abc abc abc abc", 20, None, None, True, {"block_size": 2}, PAIRS[1]),
         ("completion", "zz top zz top zz top zz", 32, SAMPLED, 7, True, {"method": "mr", "block_size": 3}, PAIRS[2]),
         ("chat", "hello", 25, SAMPLED, 5, False, {"method": "jacobi", "block_size": 2}, PAIRS[1]),
         ("completion", "abc abc abc abc abc abc", 28, None, 9, True, {"method": "ar", "block_size": 1}, PAIRS[0]),
         ("completion", "hi there what is up today", 17, None, 4, True, {"method": "mr", "block_size": 3}, PAIRS[2]),
         ("chat", "count 1 2 3", 32, SAMPLED, 21, True, {"method": "jacobi"}, DEFAULT)]


@pytest.fixture(scope="module")
def model(tiny_gguf):
    return api.load_model(str(tiny_gguf))


@pytest.fixture(scope="module")
def server(model, tiny_gguf):
    config = EngineConfig(batch=BatchConfig(method=DEFAULT.method, block_size=DEFAULT.block_size, max_batch=2,
                                            max_context=CONTEXT, min_prompt_bucket=BUCKET),
                          methods=PAIRS, max_queue=16, max_sampling=2, warm_sampling=(SAMPLED,))
    engine, app = build(model, str(tiny_gguf), config, name="tiny")
    for kind, prompt, max_tokens, sampling, seed, *_ in MIXED:  # while the engine warms up in its threads
        solo(model, kind, prompt, max_tokens, sampling, seed or 0)
    with serve_in_thread(engine, app) as client:
        client.engine = engine
        yield client


def ask(client, kind, b, stream):
    """(text, token ids, finish reason, (method, block_size) the server says it decoded with) of one request."""
    if not stream:
        status, _, r = client.post(path(kind), b)
        assert status == 200, r
        choice = r["choices"][0]
        text = choice["message"]["content"] if kind == "chat" else choice["text"]
        return text, choice["token_ids"], choice["finish_reason"], (r["jf_jax"]["method"], r["jf_jax"]["block_size"])
    events = client.stream(path(kind), b)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") if kind == "chat" else c["choices"][0]["text"]
                   for c in chunks)
    ids = [i for c in chunks for i in c["choices"][0].get("token_ids", [])]
    stats = chunks[-1]["jf_jax"]
    return text, ids, chunks[-1]["choices"][0]["finish_reason"], (stats["method"], stats["block_size"])


def test_requests_of_every_pair_share_the_server_and_get_solo_ar_tokens(server, model):
    engine = server.engine
    busy_groups = []
    step = engine._step

    def spy():  # how many batches had running rows at each iteration; slowed so that the requests overlap
        busy_groups.append(sum(g.running().any() for g in engine.groups.values()))
        time.sleep(0.01)
        step()

    engine._step = spy
    try:
        results = staggered(server, MIXED, timeout=180, send=ask)  # some join running batches, some wait for their pair
    finally:
        del engine._step
    assert len(results) == len(MIXED)
    for i, (kind, prompt, max_tokens, sampling, seed, _, _, pair) in enumerate(MIXED):
        ids, text = solo(model, kind, prompt, max_tokens, sampling, seed or 0)
        assert results[i] == (text, ids, finish(model, ids), (pair.method, pair.block_size)), MIXED[i]
    assert max(busy_groups) >= 3  # the batches of several pairs stepped in the same iterations
    wait_idle(server)
    assert server.metric("compilations_after_warmup_total") == 0  # every pair's programs compiled at warm-up
    assert server.metric("served_methods") == 4 and server.metric("batch_slots") == 8
    for pair in (DEFAULT, *PAIRS):
        labels = f'{{method="{pair.method}",block_size="{pair.block_size}"}}'
        assert server.metric("method_generation_tokens_total", labels) > 0
        assert server.metric("method_row_forwards_total", labels) > 0
        assert server.metric("method_running_requests", labels) == 0


def test_models_lists_the_served_pairs(server):
    status, _, r = server.get("/v1/models")
    card = r["data"][0]
    assert status == 200 and (card["method"], card["block_size"]) == (DEFAULT.method, DEFAULT.block_size)
    assert card["methods"] == [{"method": p.method, "block_size": p.block_size} for p in (DEFAULT, *PAIRS)]


@pytest.mark.parametrize("fields, param", [({"method": "mr"}, "block_size"),  # mr at the default block size 4
                                           ({"method": "jacobi", "block_size": 3}, "block_size"),
                                           ({"method": "ar", "block_size": 4}, "block_size"),
                                           ({"method": "lookahead"}, "method")])
def test_a_pair_not_served_gets_400_naming_the_field_and_what_is_served(server, fields, param):
    status, _, r = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 4, **fields})
    assert status == 400 and r["error"]["param"] == param, r
    if param == "method" or fields.get("method") != "ar":
        assert "jacobi/4, ar, jacobi/2, mr/3" in r["error"]["message"]
