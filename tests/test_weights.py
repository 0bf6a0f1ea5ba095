"""Weights loading: tiny GGUF / HF-directory models reproduce torch logits; bad inputs fail clearly; cache.

The GGUF files are written here the way llama.cpp's converter writes them (GGUF names, Q/K rows permuted
for llama, optionally quantized), so the loader is checked against an independent writer, not itself.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

import gguf
import jax
import numpy as np
import pytest

from jf_jax import weights
from jf_jax.model.config import ConfigError
from jf_jax.weights.hf_names import WeightsError
from jf_jax.model.transformer import forward_logits
from jf_jax.weights.tokenizer import Tokenizer
from jf_jax.weights import store
from jf_jax.weights.gguf import load_gguf
from tests.conftest import require

torch = require("torch")
transformers = require("transformers")

from tests.support.gguf_models import TEMPLATE, TOKEN_TYPES, TOKENS, VOCAB, tiny_model, write_gguf  # noqa: E402


def quantize_roundtrip(model, qtype):
    """The model with each 2-D weight replaced by what the quantized GGUF stores (the loader's target)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                kind = gguf.GGMLQuantizationType.Q8_0 if "embed_tokens" in name else qtype
                q = gguf.quants.quantize(p.numpy(), kind)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(q, kind).astype(np.float32)))
    return model


TOKENS_IN = np.random.default_rng(0).integers(0, VOCAB, size=(2, 12), dtype=np.int32)


def assert_logits_match(model, loaded, atol=1e-5):
    with torch.no_grad():
        expected = model(torch.from_numpy(TOKENS_IN).long()).logits.numpy()
    got, _ = forward_logits(loaded.params, loaded.cfg, TOKENS_IN)
    assert expected.std() > 0.5, "the test model is too close to zero to detect layout bugs"
    np.testing.assert_allclose(np.asarray(got), expected, atol=atol, rtol=0)


@pytest.mark.parametrize("tie", [False, True])
def test_gguf_llama_f32_matches_torch(tmp_path, tie):
    model = tiny_model("llama", tie=tie)
    loaded = weights.load(write_gguf(tmp_path / "tiny.gguf", model), cache=False)
    assert loaded.cfg.tie_word_embeddings == tie and ("lm_head" in loaded.params) == (not tie)
    assert loaded.cfg.rope_theta == 50000.0 and loaded.cfg.num_kv_heads == 2 and loaded.name == "tiny"
    assert_logits_match(model, loaded)


def test_gguf_llama_quantized_matches_dequantized_torch(tmp_path):
    model = tiny_model("llama", seed=1)
    path = write_gguf(tmp_path / "q.gguf", model, qtype=gguf.GGMLQuantizationType.Q4_1)
    assert {t.tensor_type.name for t in gguf.GGUFReader(path).tensors} == {"Q4_1", "Q8_0", "F32"}
    loaded = weights.load(path, cache=False)
    assert_logits_match(quantize_roundtrip(model, gguf.GGMLQuantizationType.Q4_1), loaded)


def test_gguf_qwen2_with_biases_matches_torch(tmp_path):
    model = tiny_model("qwen2", seed=2)
    loaded = weights.load(write_gguf(tmp_path / "qwen.gguf", model, arch="qwen2"), cache=False)
    assert loaded.cfg.architecture == "qwen2" and loaded.cfg.attention_bias
    assert_logits_match(model, loaded)


def save_hf_dir(path, model, **kw):
    model.generation_config.eos_token_id = [2, 0]
    model.save_pretrained(path, safe_serialization=True, **kw)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": TOKENS,
            "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": TOKEN_TYPES}
    Tokenizer.from_gguf_metadata(meta).backend.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                   "chat_template": TEMPLATE}, f)
    return str(path)


def test_hf_dir_sharded_qwen2_matches_torch(tmp_path):
    model = tiny_model("qwen2", seed=3)
    path = save_hf_dir(tmp_path / "qwen", model, max_shard_size="60KB")
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    assert len(shards) > 1 and os.path.isfile(os.path.join(path, "model.safetensors.index.json"))
    loaded = weights.load(path, cache=False)
    assert loaded.tokenizer.eos_ids == (2, 0) and loaded.tokenizer.pad_id == 0
    assert loaded.tokenizer.apply_chat_template("ab") == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    assert_logits_match(model, loaded)


def test_hf_dir_bfloat16_is_read_exactly(tmp_path):
    model = tiny_model("qwen2", seed=4)
    with torch.no_grad():  # the float32 reference holds exactly the bf16 checkpoint's values
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    # Converted copy, not model.to(bfloat16): that would also round the float32 RoPE buffer.
    path = save_hf_dir(tmp_path / "bf16", tiny_model("qwen2", seed=4).to(torch.bfloat16))
    loaded = weights.load(path, dtype="float32", cache=False)
    assert loaded.cfg.dtype == "float32" and loaded.params["embed"].dtype == np.float32
    expected = model.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(loaded.params["embed"]), expected)
    assert_logits_match(model, loaded)
    assert weights.load(path, dtype="bfloat16", cache=False).params["embed"].dtype == jax.numpy.bfloat16


# --- errors name the file and the problem ---------------------------------------------------------------

def test_bad_specs_list_what_is_accepted(tmp_path):
    for spec in ["no-such-model", str(tmp_path / "missing.gguf")]:
        with pytest.raises(WeightsError, match="accepted: a model name .*smollm2-135m"):
            weights.load(spec)
    with pytest.raises(WeightsError, match="has no config.json"):
        weights.load(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(WeightsError, match="neither a .gguf file"):
        weights.load(str(tmp_path / "notes.txt"))
    with pytest.raises(WeightsError, match="does not exist"):
        load_gguf(str(tmp_path / "missing.gguf"))


def test_corrupt_gguf_files(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", tiny_model("llama"))
    data = open(good, "rb").read()
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(WeightsError, match=r"garbage\.gguf is not a GGUF file \(bad magic"):
        weights.load(str(garbage), cache=False)
    for cut in (len(data) // 2, 200, len(data) - 10):
        truncated = tmp_path / f"cut{cut}.gguf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(WeightsError, match=rf"cut{cut}\.gguf is truncated"):
            weights.load(str(truncated), cache=False)


def test_gguf_content_errors(tmp_path):
    model = tiny_model("llama")
    with pytest.raises(ConfigError, match=r"arch\.gguf: unsupported general\.architecture 'gpt2'"):
        weights.load(write_gguf(tmp_path / "arch.gguf", model, architecture="gpt2"), cache=False)
    with pytest.raises(WeightsError, match=r"missing layers \[1\] of w_up"):
        weights.load(write_gguf(tmp_path / "missing.gguf", model, skip={"blk.1.ffn_up.weight"}), cache=False)
    with pytest.raises(WeightsError, match=r"model\.layers\.0\.self_attn\.v_proj\.weight has shape \(64, 64\)"):
        weights.load(write_gguf(tmp_path / "shape.gguf", model,
                                reshape={"blk.0.attn_v.weight": lambda w: np.concatenate([w, w])}), cache=False)


LINEAR4 = dict(rope_type="linear", factor=4.0)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024, beta_fast=8.0, beta_slow=4.0)
ROPE_CASES = {  # name: (HF rope_scaling, the GGUF metadata llama.cpp's converter / loader give it)
    "linear": (LINEAR4, {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),
    "linear-by-default": (LINEAR4, {"rope.scaling.factor": 4.0}),  # llama.cpp's type when none is given
    "legacy-scale-linear": (LINEAR4, {"rope.scale_linear": 4.0}),  # the factor's old key name
    "yarn-betas": (YARN, {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                          "rope.scaling.original_context_length": 1024, "rope.scaling.yarn_beta_fast": 8.0,
                          "rope.scaling.yarn_beta_slow": 4.0}),
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_gguf_rope_scaling_matches_torch(tmp_path, case):
    hf_scaling, metadata = ROPE_CASES[case]
    model = tiny_model("llama", seed=4, rope_scaling=dict(hf_scaling), max_position_embeddings=4096)
    loaded = weights.load(write_gguf(tmp_path / "rope.gguf", model, metadata=metadata), cache=False)
    s = loaded.cfg.rope_scaling
    assert (s.rope_type, s.factor) == (hf_scaling["rope_type"], 4.0)
    assert_logits_match(model, loaded)

    def with_scaling(scaling):
        return dataclasses.replace(loaded, cfg=dataclasses.replace(loaded.cfg, rope_scaling=scaling))

    with pytest.raises(AssertionError):  # the check above sees the scaling dropped...
        assert_logits_match(model, with_scaling(None))
    if case == "yarn-betas":  # ...and the betas ignored
        assert (s.beta_fast, s.beta_slow, s.original_max_position_embeddings) == (8.0, 4.0, 1024)
        with pytest.raises(AssertionError):
            assert_logits_match(model, with_scaling(dataclasses.replace(s, beta_fast=32.0, beta_slow=1.0)))


def test_gguf_unapplied_rope_scaling_is_refused_before_conversion(tmp_path, monkeypatch):
    import jf_jax.weights.gguf as gguf_loader

    def no_conversion(*a, **k):
        raise AssertionError("tensors converted before the metadata was checked")

    monkeypatch.setattr(gguf_loader, "hf_tensors", no_conversion)
    model = tiny_model("llama")
    linear = {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32}
    cases = {  # file: (metadata, keys the error must name)
        "attn.gguf": ({**linear, "rope.scaling.attn_factor": 2.0, "rope.scaling.yarn_beta_fast": 16.0},
                      ["llama.rope.scaling.attn_factor=2.0", "llama.rope.scaling.yarn_beta_fast=16.0"]),
        "yarnattn.gguf": ({**yarn, "rope.scaling.yarn_attn_factor": 1.0, "rope.scaling.yarn_log_multiplier": 0.1},
                          ["llama.rope.scaling.yarn_attn_factor=1.0", "llama.rope.scaling.yarn_log_multiplier="]),
        "ext.gguf": ({**linear, "rope.scaling.yarn_ext_factor": 1.0}, ["llama.rope.scaling.yarn_ext_factor=1.0"]),
        "alpha.gguf": ({"rope.scaling.alpha": 1000.0}, ["llama.rope.scaling.alpha=1000.0"]),
        "future.gguf": ({**yarn, "rope.scaling.mystery": 3}, ["llama.rope.scaling.mystery=3"]),
    }
    for name, (metadata, keys) in cases.items():
        with pytest.raises(ValueError, match=r"RoPE scaling metadata jf-jax does not apply") as e:
            weights.load(write_gguf(tmp_path / name, model, metadata=metadata), cache=False)
        assert isinstance(e.value, ConfigError) and str(tmp_path / name) in str(e.value)
        for key in keys:
            assert key in str(e.value), (name, key, str(e.value))
    with pytest.raises(ConfigError, match=r"lr\.gguf: llama\.rope\.scaling\.type 'longrope' is not supported"):
        weights.load(write_gguf(tmp_path / "lr.gguf", model, metadata={"rope.scaling.type": "longrope"}), cache=False)


def test_gguf_neutral_rope_scaling_values_load(tmp_path):
    """The values llama.cpp's own defaults (and its model saver) write change nothing: accepted silently."""
    model = tiny_model("llama", seed=5)
    neutral = {"rope.scaling.type": "none", "rope.scaling.factor": 4.0, "rope.scaling.attn_factor": 1.0,
               "rope.scaling.original_context_length": 64, "rope.scaling.finetuned": False,
               "rope.scaling.yarn_log_multiplier": 0.0, "rope.scaling.yarn_ext_factor": -1.0,
               "rope.scaling.yarn_attn_factor": 1.0, "rope.scaling.yarn_beta_fast": 32.0,
               "rope.scaling.yarn_beta_slow": 1.0, "rope.scaling.alpha": 1.0}
    loaded = weights.load(write_gguf(tmp_path / "neutral.gguf", model, metadata=neutral), cache=False)
    assert loaded.cfg.rope_scaling is None
    assert_logits_match(model, loaded)
    linear1 = {"rope.scaling.type": "linear", "rope.scaling.factor": 0.0, "rope.scaling.attn_factor": 1.0}
    assert weights.load(write_gguf(tmp_path / "l1.gguf", model, metadata=linear1), cache=False).cfg.rope_scaling is None


def test_hf_dir_errors(tmp_path):
    model = tiny_model("qwen2")
    path = save_hf_dir(tmp_path / "m", model, max_shard_size="60KB")
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    os.remove(os.path.join(path, sorted(set(index["weight_map"].values()))[-1]))
    with pytest.raises(WeightsError, match="shards listed in model.safetensors.index.json are missing"):
        weights.load(path, cache=False)
    os.remove(os.path.join(path, "model.safetensors.index.json"))
    with pytest.raises(WeightsError, match="has no weights: expected model.safetensors"):
        weights.load(path, cache=False)
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(WeightsError, match="model.safetensors is not a readable safetensors file"):
        weights.load(path, cache=False)


# --- the converted-params cache ---------------------------------------------------------------------

def _same_params(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
                            for x, y in zip(la, lb))


def test_cache_round_trip_is_identical_and_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("JF_JAX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "c.gguf", tiny_model("llama"), qtype=gguf.GGMLQuantizationType.Q8_0)
    t0 = time.perf_counter()
    first = weights.load(path)
    t1 = time.perf_counter()
    second = weights.load(path)
    t2 = time.perf_counter()
    assert os.path.isdir(store.entry_dir(path))
    assert store.load_or_convert(path, lambda _: pytest.fail("cache hit expected"))[3]
    assert _same_params(first.params, second.params) and first.cfg == second.cfg
    ids = [1, TOKENS.index("ab"), TOKENS.index("Ġ"), TOKENS.index("c")]
    assert second.tokenizer.encode("<|im_start|>ab c") == first.tokenizer.encode("<|im_start|>ab c") == ids
    assert second.tokenizer.eos_ids == first.tokenizer.eos_ids
    assert t2 - t1 < t1 - t0, f"cached load took {t2 - t1:.3f}s, conversion {t1 - t0:.3f}s"
    # The cached params serve any dtype; a changed source misses the cache.
    assert weights.load(path, dtype="bfloat16").params["embed"].dtype == jax.numpy.bfloat16
    os.utime(path, ns=(1, 1))
    assert not store.load_or_convert(path, load_gguf)[3]


def test_a_cached_load_runs_the_programs_compiled_for_a_converted_one(tmp_path, monkeypatch):
    """A conversion gives numpy arrays, a cache entry (or a run directory) orbax arrays on a device; the loaded
    params are placed alike, so decoding the same model loaded again compiles nothing new."""
    from jf_jax import api
    from jf_jax.decoding.ar import ARDecoder

    monkeypatch.setenv("JF_JAX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "d.gguf", tiny_model("llama"))
    converted = api.load_model(path, dtype="bfloat16", column_shards=1)
    (want,) = api.generate(converted, ["ab c"], max_new_tokens=3, chat=False)
    compiled = ARDecoder.init.program()._cache_size(), ARDecoder.run_compiled.program()._cache_size()
    cached = api.load_model(path, dtype="bfloat16", column_shards=1)
    assert store.load_or_convert(path, lambda _: pytest.fail("cache hit expected"))[3]
    (got,) = api.generate(cached, ["ab c"], max_new_tokens=3, chat=False)
    assert got.token_ids == want.token_ids
    assert (ARDecoder.init.program()._cache_size(), ARDecoder.run_compiled.program()._cache_size()) == compiled


def test_failed_or_partial_saves_are_never_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("JF_JAX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "p.gguf", tiny_model("llama"))

    def disk_full(self, where):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:  # a save that dies half-way leaves nothing behind, and the load works
        m.setattr(Tokenizer, "save", disk_full)
        assert weights.load(path).cfg.num_layers == 2
    assert os.listdir(tmp_path / "cache") == []
    # An entry missing files (e.g. copied by hand, or from an older version) is re-converted, not trusted.
    entry = store.entry_dir(path)
    os.makedirs(os.path.join(entry, "params"))
    assert not store.load_or_convert(path, load_gguf)[3]
    assert store.load_or_convert(path, load_gguf)[3]
    # A corrupt orbax checkpoint in a complete-looking entry is also re-converted.
    for root, _, files in os.walk(os.path.join(entry, "params")):
        for f in files:
            open(os.path.join(root, f), "wb").close()
    assert not store.load_or_convert(path, load_gguf)[3]


def test_runtime_modules_do_not_import_torch_or_transformers():
    code = ("import sys, jf_jax.weights, jf_jax.weights.tokenizer; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
