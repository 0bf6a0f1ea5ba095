"""Exporting a model as a Hugging Face directory: transformers loads it on its own and its logits, tokenizer and
chat template equal jf-jax's; jf-jax reads it back bit for bit; bad destinations are refused up front."""

import json

import jax
import numpy as np
import pytest

from jf_jax import weights
from jf_jax.cli import export as export_cli
from jf_jax.model.transformer import forward_logits
from jf_jax.weights.hf_export import export_hf
from jf_jax.weights.hf_names import WeightsError
from tests.conftest import require
from tests.support.hf_models import jax_twin, make_hf_model

torch = require("torch")
transformers = require("transformers")


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return weights.load(str(tiny_gguf), cache=False)


def _hf_logits(out_dir, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens))).logits.numpy(), model


def _same_params(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("arch,tie", [("llama", True), ("qwen2", False)])
def test_transformers_loads_the_export_with_equal_logits(tiny, tmp_path, arch, tie):
    cfg, params = jax_twin(make_hf_model(arch, tie=tie, vocab=tiny.cfg.vocab_size, seed=5))
    out = export_hf(cfg, params, tiny.tokenizer, tmp_path / "export")
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 23))
    theirs, model = _hf_logits(out, tokens)
    assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    ours, _ = forward_logits(params, cfg, tokens)
    np.testing.assert_allclose(theirs, np.asarray(ours), atol=2e-5, rtol=1e-5)
    back = weights.load(out, cache=False)
    assert back.cfg == cfg and _same_params(back.params, params)


def test_tokenizer_and_generation_config_survive_the_export(tiny, tmp_path):
    out = export_hf(tiny.cfg, tiny.params, tiny.tokenizer, tmp_path / "export")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "abc Hello world 0123 ab"
    assert hf_tok(text)["input_ids"] == tiny.tokenizer.encode(text)
    messages = [{"role": "user", "content": "hi there"}]
    assert hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tiny.tokenizer.apply_chat_template(messages)
    ids = tiny.tokenizer.encode(text)
    assert hf_tok.decode(ids) == tiny.tokenizer.decode(ids)
    with open(f"{out}/generation_config.json") as f:
        generation = json.load(f)
    eos = generation["eos_token_id"]
    assert set(eos if isinstance(eos, list) else [eos]) == set(tiny.tokenizer.eos_ids)
    reloaded = weights.load(out, cache=False).tokenizer
    assert reloaded.eos_ids == tiny.tokenizer.eos_ids and reloaded.bos_id == tiny.tokenizer.bos_id
    assert reloaded.encode(text) == tiny.tokenizer.encode(text)


def test_existing_destinations_are_refused_unless_overwriting_an_export(tiny, tmp_path):
    out = export_hf(tiny.cfg, tiny.params, tiny.tokenizer, tmp_path / "export")
    with pytest.raises(WeightsError, match="already exists"):
        export_hf(tiny.cfg, tiny.params, tiny.tokenizer, out)
    export_hf(tiny.cfg, tiny.params, tiny.tokenizer, out, overwrite=True)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "important.txt").write_text("keep me")
    with pytest.raises(WeightsError, match="other than a Hugging Face export"):
        export_hf(tiny.cfg, tiny.params, tiny.tokenizer, other, overwrite=True)
    assert (other / "important.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export-")]  # no staging left behind


def test_cli_exports_and_reports_errors_without_traceback(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "cli_export"
    assert export_cli.main([str(tiny_gguf), str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    assert export_cli.main([str(tiny_gguf), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert export_cli.main([str(tmp_path / "no_such_model"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "Traceback" not in err
