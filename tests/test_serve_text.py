"""The server's pure pieces without a server: streamed text and stop strings (``serving.text``), request checks
(``serving.protocol``), the layout of a batch (``serving.batch``) and the command's options."""

import dataclasses

import pytest

from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.sampling import Sampling
from jf_jax.serving.batch import BatchConfig, ServedMethod, plan_layout
from jf_jax.serving.command import build_parser, engine_config, model_name
from jf_jax.serving.protocol import APIError, Served, parse_request
from jf_jax.serving.text import TextStream, held_back, tokens_through_stop

VOCAB = {i: c for i, c in enumerate("abcdefgh XYZ")}
VOCAB[20] = "\ufffd"  # a token that decodes to an unfinished character until the next one completes it


def decode(ids):
    text = "".join(VOCAB[i] for i in ids)
    return text.replace("\ufffd" + "Z", "é")  # token 20 then token 11 ("Z") spell one character


def ids(text):
    inverse = {c: i for i, c in VOCAB.items()}
    return [inverse[c] for c in text]


def test_text_is_streamed_as_a_prefix_of_the_final_text():
    stream = TextStream(decode)
    assert stream.push(ids("ab")) == "ab"
    assert stream.push([20]) == ""  # an unfinished character is held back...
    assert stream.push([11, 2]) == "éc"  # ...until it is complete
    assert stream.finish() == "" and stream.tokens == ids("ab") + [20, 11, 2]


def test_stop_strings_cut_the_text_before_them_and_the_tokens_after_them():
    stream = TextStream(decode, ("cde", "hh"))
    assert stream.push(ids("abc")) == "ab"  # "c" may start "cde"
    assert stream.push(ids("dX")) == "cdX" and not stream.stopped  # "cdX" is not "cde": all of it is final
    stream2 = TextStream(decode, ("cde",))
    sent = stream2.push(ids("abcd")) + stream2.push(ids("efg"))  # "e" completes the stop; "fg" came in the same burst
    assert sent == "ab" and stream2.stopped and stream2.tokens == ids("abcde") and stream2.finish() == ""


def test_held_back_and_tokens_through_stop():
    assert held_back("xxab", ["abc"]) == 2 and held_back("xxa", ["bc"]) == 0 and held_back("x\ufffd", []) == 1
    assert tokens_through_stop(decode, ids("abcdef"), ["cd"]) == 4
    assert tokens_through_stop(decode, ids("abc"), ["zz"]) == 3


SERVED = Served(model="tiny", aliases=("/m/tiny.gguf",), methods=(ServedMethod("jacobi", 8),), block_size=8,
                max_context=32, vocab_size=12, encode=ids, render_chat=lambda ms: "".join(m["content"] for m in ms))


def test_neutral_values_of_unsupported_fields_are_accepted():
    req = parse_request({"model": "/m/tiny.gguf", "prompt": "abc", "n": 1, "logprobs": None, "echo": False,
                         "presence_penalty": 0, "user": "me", "temperature": 1, "top_p": 0.5, "stop": "h",
                         "method": "jacobi", "block_size": 8}, "completion", SERVED, default_seed=9)
    assert req.prompt == tuple(ids("abc")) and req.max_tokens == 29 and req.seed == 9 and req.stop == ("h",)
    assert req.sampling == Sampling(temperature=1.0, top_p=0.5)
    chat = parse_request({"messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": [
        {"type": "text", "text": "c"}]}], "max_completion_tokens": 3, "seed": 4}, "chat", SERVED, default_seed=0)
    assert chat.prompt == tuple(ids("abc")) and chat.max_tokens == 3 and chat.seed == 4


def test_a_greedy_request_with_top_p_is_refused_by_name():
    with pytest.raises(APIError) as e:
        parse_request({"prompt": "abc", "top_p": 0.5}, "completion", SERVED, default_seed=0)
    assert e.value.status == 400 and e.value.param == "top_p"


def test_layout_buckets_and_capacity():
    from tests.support.decoding_models import CFG  # a tiny config: context 64 or more

    layout = plan_layout(CFG, BatchConfig(method="jacobi", block_size=4, max_batch=2, max_context=40))
    assert layout.prompt_buckets == (16, 32, 64) and layout.bucket_for(17) == 32 and layout.out_capacity == 40
    assert layout.cache_capacity % 64 == 0 and layout.cache_capacity >= 64 + 4
    one = plan_layout(CFG, BatchConfig(max_context=40, min_prompt_bucket=64))
    assert one.prompt_buckets == (64,)


def test_command_options():
    args = build_parser().parse_args(["--method", "mr", "--sampling", "0.7,1:0.9", "--max-sampling", "3"])
    config = engine_config(args)
    assert config.batch.method == "mr" and config.warm_sampling == (Sampling(0.7), Sampling(1.0, top_p=0.9))
    assert model_name("/x/y/tiny.gguf") == "tiny" and model_name("smollm2-135m") == "smollm2-135m"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--sampling", "hot"])


SEVERAL = dataclasses.replace(SERVED, methods=(ServedMethod("jacobi", 8), ServedMethod("ar", 1),
                                               ServedMethod("mr", 8), ServedMethod("jacobi", 16)))


@pytest.mark.parametrize("fields, method", [
    ({}, ServedMethod("jacobi", 8)),  # neither field: the default pair
    ({"method": "ar"}, ServedMethod("ar", 1)),
    ({"method": "ar", "block_size": 1}, ServedMethod("ar", 1)),
    ({"block_size": 16}, ServedMethod("jacobi", 16)),  # the default method at another block size
    ({"method": "mr"}, ServedMethod("mr", 8)),  # another method at the default block size
    ({"method": "jacobi", "block_size": 8}, ServedMethod("jacobi", 8)),
])
def test_a_request_picks_a_served_method_and_block_size(fields, method):
    assert parse_request({"prompt": "abc", **fields}, "completion", SEVERAL, default_seed=0).method == method


@pytest.mark.parametrize("fields, status, param, says", [
    ({"method": "beam"}, 400, "method", "jacobi/8, ar, mr/8, jacobi/16"),  # the message lists what is served
    ({"method": "mr", "block_size": 16}, 400, "block_size", "mr/8"),
    ({"block_size": 4}, 400, "block_size", "jacobi/16"),
    ({"method": "ar", "block_size": 8}, 400, "block_size", "one token per forward"),
    ({"method": 3}, 422, "method", "a string"),
    ({"block_size": "8"}, 422, "block_size", "an integer"),
    ({"block_size": True}, 422, "block_size", "an integer"),
])
def test_a_pair_that_is_not_served_is_refused_by_field(fields, status, param, says):
    with pytest.raises(APIError) as e:
        parse_request({"prompt": "abc", **fields}, "completion", SEVERAL, default_seed=0)
    assert (e.value.status, e.value.param) == (status, param) and says in e.value.message


def test_served_pairs_from_the_options():
    args = build_parser().parse_args(["--method", "jacobi", "--methods", "ar,mr", "--block-sizes", "4,8",
                                      "--drain-seconds", "2"])
    config = engine_config(args)
    assert [m.describe() for m in config.served] == ["jacobi/8", "jacobi/4", "ar", "mr/8", "mr/4"]
    assert config.batch.served_method == ServedMethod("jacobi", 8)  # --method / --block-size: the default
    ar_default = engine_config(build_parser().parse_args(["--method", "ar", "--methods", "jacobi"]))
    assert [m.describe() for m in ar_default.served] == ["ar", "jacobi/8"]
    assert engine_config(build_parser().parse_args([])).served == (ServedMethod("jacobi", 8),)


@pytest.mark.parametrize("argv", [["--methods", "beam"], ["--methods", ""], ["--block-sizes", "8,x"]])
def test_bad_method_options_are_refused_by_the_parser(argv):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


@pytest.mark.parametrize("argv, says", [(["--block-sizes", "0"], "block_size"),
                                        (["--drain-seconds", "-1"], "--drain-seconds"),
                                        (["--drain-seconds", "nan"], "--drain-seconds")])
def test_bad_method_values_are_refused_before_loading(argv, says):
    with pytest.raises(GenerationError, match=says):
        engine_config(build_parser().parse_args(argv))


def test_served_method_checks_its_pair():
    assert ServedMethod.of("ar", 16) == ServedMethod("ar", 1) and ServedMethod("mr", 4).describe() == "mr/4"
    for method, block in (("ar", 8), ("beam", 4), ("jacobi", 0)):
        with pytest.raises(GenerationError):
            ServedMethod(method, block)
