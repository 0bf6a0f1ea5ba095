"""Small random Hugging Face models (test-time only: needs torch + transformers) and their jf-jax twins."""

from __future__ import annotations

import numpy as np

from tests.conftest import require

torch = require("torch")
transformers = require("transformers")

from jf_jax.model.config import from_hf_config  # noqa: E402
from jf_jax.weights.hf_names import params_from_hf  # noqa: E402

ARCHS = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def make_hf_model(arch: str, *, tie: bool, seed: int = 0, vocab: int = 128, hidden: int = 64, layers: int = 2,
                  heads: int = 4, kv_heads: int = 2, intermediate: int = 96, context: int = 512, **extra):
    """A random HF model whose weights are scaled so greedy outputs vary (HF's 0.02 init collapses them).
    ``extra`` goes to the config (e.g. ``head_dim``, ``rope_scaling``)."""
    config_cls, model_cls = ARCHS[arch]
    hf_config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                           max_position_embeddings=context, rope_theta=1000.0 + 17 * seed, rms_norm_eps=1e-6,
                           tie_word_embeddings=tie, **extra)
    torch.manual_seed(seed)
    model = model_cls(hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif p.ndim == 1:  # q/k/v biases
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
        if tie:
            model.tie_weights()
    return model


def jax_twin(model, **overrides):
    """(cfg, params) of a HF model, converted through the strict name map."""
    cfg = from_hf_config(model.config.to_dict(), **overrides)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    return cfg, params_from_hf(cfg, state)


def hf_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens))).logits.float().numpy()


def hf_greedy(model, prompt, max_new_tokens: int, eos_id: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos_id, pad_token_id=eos_id,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()
