"""Tokenizer: built from GGUF metadata or an HF directory, without torch or transformers.

The real SmolLM2 GGUF is compared against transformers' own GGUF tokenizer and chat template (test-time
only); the tiny vocabularies below check the rules (special tokens, BOS, errors, save/restore).
"""

import json

import pytest

from jf_jax.weights.tokenizer import Tokenizer, TokenizerError
from jf_jax.weights.embedded import smollm2_gguf_path
from jf_jax.weights.gguf import open_gguf, read_metadata
from tests.conftest import require

_CHARS = "abcdefghijklmnopqrstuvwxyzĠ0123456789"
TINY = {
    "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
    "tokenizer.ggml.tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", *_CHARS, "ab", "Ġa"],
    "tokenizer.ggml.token_type": [3, 3, 3, 4] + [1] * (len(_CHARS) + 2),
    "tokenizer.ggml.merges": ["a b", "Ġ a"],
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.padding_token_id": 0,
    "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
}


def tok_id(tok, s):
    return tok.token_to_id(s)


def test_tiny_gguf_tokenizer_rules():
    tok = Tokenizer.from_gguf_metadata(TINY)
    assert tok.vocab_size == len(TINY["tokenizer.ggml.tokens"])
    # <|im_end|> ends chat turns in the template, so it stops generation alongside the GGUF eos.
    assert tok.eos_ids == (0, 2) and tok.bos_id == 1 and tok.pad_id == 0 and not tok.add_bos
    ids = tok.encode("<|im_start|>ab a<think>12<|im_end|>")
    assert ids == [1, tok_id(tok, "ab"), tok_id(tok, "Ġa"), 3, tok_id(tok, "1"), tok_id(tok, "2"), 2]
    assert tok.decode(ids) == "ab a<think>12"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>ab a<think>12<|im_end|>"
    with_bos = Tokenizer.from_gguf_metadata({**TINY, "tokenizer.ggml.add_bos_token": True})
    assert with_bos.encode("ab") == [1, tok_id(tok, "ab")]


def test_tiny_chat_template():
    tok = Tokenizer.from_gguf_metadata(TINY)
    assert tok.apply_chat_template("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == \
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
    bad = Tokenizer.from_gguf_metadata({**TINY, "tokenizer.chat_template": "{{ raise_exception('no system') }}"})
    with pytest.raises(TokenizerError, match="no system"):
        bad.apply_chat_template("x")
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_gguf_metadata({**TINY, "tokenizer.chat_template": None}).apply_chat_template("x")


def test_unsupported_tokenizers_are_rejected():
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model is 'llama'"):
        Tokenizer.from_gguf_metadata({**TINY, "tokenizer.ggml.model": "llama"})
    with pytest.raises(TokenizerError, match="unsupported GGUF pre-tokenizer 'tekken'"):
        Tokenizer.from_gguf_metadata({**TINY, "tokenizer.ggml.pre": "tekken"})
    with pytest.raises(TokenizerError, match="lacks tokenizer.ggml.tokens"):
        Tokenizer.from_gguf_metadata({**TINY, "tokenizer.ggml.merges": []})


def test_save_and_hf_dir_round_trip(tmp_path):
    tok = Tokenizer.from_gguf_metadata(TINY)
    tok.save(str(tmp_path / "saved"))
    again = Tokenizer.load_saved(str(tmp_path / "saved"))
    text = "<|im_start|>ab 123 a<|im_end|>"
    assert again.encode(text) == tok.encode(text) and again.eos_ids == tok.eos_ids
    assert again.apply_chat_template("q") == tok.apply_chat_template("q")

    hf = tmp_path / "hf"
    hf.mkdir()
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(str(hf))
    tok.backend.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>", "add_bos_token": True,
         "chat_template": TINY["tokenizer.chat_template"]}))
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    from_dir = Tokenizer.from_hf_dir(str(hf))
    assert from_dir.eos_ids == (0, 2) and from_dir.bos_id == 1 and from_dir.pad_id is None
    assert from_dir.encode("ab") == [1, tok_id(tok, "ab")]
    assert from_dir.apply_chat_template("q") == tok.apply_chat_template("q")


# --- the real SmolLM2 tokenizer against transformers' -----------------------------------------------

TEXTS = [
    "Hello, world!",
    "  leading spaces,\ttabs\n\nand newlines\r\n",
    "def square(x):\n    return x ** 2  # comment\n",
    "12345 + 678 = 13023; pi = 3.14159e-10; 2024-06-01",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, emoji 🤖👍🏽, a\u00a0b",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|>glued<|endoftext|><repo_name>x<file_sep>y",
    "don't I'm we'll they've",
    "<|im_start", "",
    "    ",
    "SELECT * FROM t WHERE id IN (1, 2, 3);",
]


# tests.conftest.require guards this file's transformers comparisons (and every test dependency of the suite); its
# own check sits here, in a module that needs no optional dependency, so it runs wherever the suite does.
def test_require_fails_under_ci_and_skips_elsewhere(monkeypatch):
    missing = "jf_jax_no_such_test_dependency"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=rf"'{missing}' cannot be imported and CI=true") as e:
        require(missing)
    assert not isinstance(e.value, pytest.skip.Exception)
    assert require("json") is json
    for ci in ("false", None):
        if ci is None:
            monkeypatch.delenv("CI")
        else:
            monkeypatch.setenv("CI", ci)
        with pytest.raises(pytest.skip.Exception, match=missing):
            require(missing)
        assert require("json") is json


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf_path()
    return path, Tokenizer.from_gguf_metadata(read_metadata(open_gguf(path), path), path)


@pytest.fixture(scope="module")
def hf_smollm2(smollm2):
    require("torch")
    transformers = require("transformers")
    import os

    path, _ = smollm2
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                      local_files_only=True)


@pytest.mark.slow
def test_smollm2_special_ids(smollm2, hf_smollm2):
    _, tok = smollm2
    assert tok.vocab_size == 49152 == len(hf_smollm2)
    assert tok.bos_id == hf_smollm2.bos_token_id == 1
    assert tok.eos_ids == (hf_smollm2.eos_token_id,) == (2,)
    assert tok.pad_id == 2 and not tok.add_bos
    assert [tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")] == [1, 2]


@pytest.mark.slow
def test_smollm2_encode_decode_matches_transformers(smollm2, hf_smollm2):
    _, tok = smollm2
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_smollm2(text)["input_ids"], text
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_smollm2.decode(ids, skip_special_tokens=skip)
        assert tok.decode(ids, skip_special_tokens=False) == text  # byte-level BPE is lossless


@pytest.mark.slow
def test_smollm2_digits_split_one_by_one(smollm2):
    _, tok = smollm2  # as SmolLM2's tokenizer.json's Digits(individual_digits=True) pre-tokenizer does
    assert [tok.decode([i]) for i in tok.encode("x 2024")] == ["x", " ", "2", "0", "2", "4"]


@pytest.mark.slow
def test_smollm2_chat_template_matches_transformers(smollm2, hf_smollm2):
    _, tok = smollm2
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi\nthere"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye ☃"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            expected = hf_smollm2.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == expected
    assert tok.apply_chat_template("What is 2+2?") == tok.apply_chat_template(conversations[0])
