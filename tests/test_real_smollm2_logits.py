"""The real embedded SmolLM2-135M-Instruct GGUF: jf-jax logits equal transformers' in float32.

transformers is the reference: its own GGUF reader, dequantizer and Q/K un-permutation
(``load_gguf_checkpoint``, the code ``from_pretrained(..., gguf_file=...)`` runs; calling it directly
avoids the extra ``accelerate`` dependency that ``from_pretrained`` demands for GGUF files).
The load also goes through the orbax cache twice, checking the cached copy on a real-size model.
"""

import copy
import time

import jax
import numpy as np
import pytest

from jf_jax import weights
from jf_jax.model.transformer import forward_logits
from jf_jax.weights import store
from tests.conftest import require

torch = require("torch")
transformers = require("transformers")
pytestmark = pytest.mark.slow  # ~1 min: reads and dequantizes a 135M-parameter GGUF twice

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog. 1234567890 ☃",
]
# Both float32 implementations sit 0.8-2e-4 from transformers run in float64 (logit std ~7), depending on
# XLA's matmul blocking for the batch shape: summation-order noise over 30 layers, not a layout error
# (which moves logits by O(1)). So both comparisons use the same bound, 2.5x the worst seen.
MAX_ABS_DIFF = 5e-4


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    """(first load: GGUF -> convert -> cache, second load: from the cache, seconds each)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(store.CACHE_ENV, str(tmp_path_factory.mktemp("jf_cache")))
        t0 = time.perf_counter()
        first = weights.load("smollm2-135m")
        t1 = time.perf_counter()
        second = weights.load("smollm2-135m")
        t2 = time.perf_counter()
    return first, second, t1 - t0, t2 - t1


@pytest.fixture(scope="module")
def hf_model(loads):
    """transformers' model with transformers' GGUF config and tensors (one read of the file: it is slow)."""
    from jf_jax.weights.hf_reference import transformers_model_from_gguf

    model = transformers_model_from_gguf(loads[0].source, loads[0].cfg.num_layers)
    assert model.config.tie_word_embeddings
    return model


def test_cached_load_is_identical_and_faster(loads):
    first, second, convert_s, cached_s = loads
    assert first.cfg == second.cfg and first.name == "smollm2-135m"
    leaves1, tree1 = jax.tree.flatten(first.params)
    leaves2, tree2 = jax.tree.flatten(second.params)
    assert tree1 == tree2
    assert all(a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(leaves1, leaves2))
    print(f"SmolLM2 load: convert+save {convert_s:.1f}s, from cache {cached_s:.1f}s")
    assert cached_s < convert_s


def test_config_matches_transformers(loads, hf_model):
    cfg, hf = loads[1].cfg, hf_model.config
    assert (cfg.architecture, cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == \
        ("llama", hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads,
         hf.num_key_value_heads)
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"] and cfg.rms_norm_eps == hf.rms_norm_eps
    assert cfg.tie_word_embeddings and "lm_head" not in loads[1].params


def test_float32_logits_match_transformers(loads, hf_model):
    tok = loads[1].tokenizer
    texts = [tok.apply_chat_template(p) if isinstance(p, list) else p for p in PROMPTS]
    encoded = [tok.encode(t) for t in texts]
    # One right-padded batch (one compile): causal attention keeps real positions unaffected by the padding.
    ids = np.full((len(encoded), max(map(len, encoded))), tok.pad_id, np.int32)
    for row, seq in enumerate(encoded):
        ids[row, :len(seq)] = seq
    with torch.no_grad():
        expected = hf_model(torch.from_numpy(ids).long()).logits.numpy()
        exact = copy.deepcopy(hf_model).double()(torch.from_numpy(ids).long()).logits.numpy()
    got = np.asarray(forward_logits(loads[1].params, loads[1].cfg, ids)[0])
    for row, seq in enumerate(encoded):
        g, e, x = got[row, :len(seq)], expected[row, :len(seq)], exact[row, :len(seq)]
        ours, theirs = np.max(np.abs(g - x)), np.max(np.abs(e - x))
        print(f"{len(seq):3d} tokens: max |logit diff| vs transformers f32 {np.max(np.abs(g - e)):.2e}; "
              f"vs float64: ours {ours:.2e}, transformers' {theirs:.2e} (logit std {e.std():.2f})")
        np.testing.assert_allclose(g, e, atol=MAX_ABS_DIFF, rtol=0)
        np.testing.assert_array_equal(g.argmax(-1), e.argmax(-1))
        np.testing.assert_allclose(g, x, atol=MAX_ABS_DIFF, rtol=0)


GENERATE_PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is 17 times 23? Answer briefly.",
    "Name three colours of the rainbow.",
]


def test_greedy_tokens_equal_transformers_generate(loads, hf_model):
    """Compiled jf-jax AR decoding == transformers' greedy ``generate`` on the real weights, chat prompts."""
    from jf_jax.decoding.ar import generate_ar
    from jf_jax.model.decode_view import decode_view

    model = loads[1]
    tok = model.tokenizer
    encoded = [tok.encode(tok.apply_chat_template(p)) for p in GENERATE_PROMPTS]
    result = generate_ar(decode_view(model.params), model.cfg, encoded, max_new_tokens=32, eos_ids=tok.eos_ids)
    for ids, ours in zip(encoded, result.token_ids):
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=32, do_sample=False, eos_token_id=list(tok.eos_ids),
                                    pad_token_id=tok.pad_id)
        theirs = out[0, len(ids):].tolist()
        assert ours == theirs, f"{tok.decode(ours)!r} != {tok.decode(theirs)!r}"
        assert len(ours) >= 8
