"""Tiny GGUF models written the way llama.cpp's converter writes them (test-time only: torch, transformers).

Shared by the weights, tokenizer and CLI tests: GGUF names, Q/K rows permuted for llama, optionally quantized,
with a tiny byte-level vocabulary and a chat template, so the loader is checked against an independent writer.
"""

import gguf
import numpy as np

from tests.conftest import require

torch = require("torch")
transformers = require("transformers")

VOCAB = 64
# A tiny byte-level vocabulary: 3 control tokens, 60 characters ("Ġ" is byte-level space), one merge "a b".
_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZĠ0123456"
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_CHARS, "ab"]
TOKEN_TYPES = [3, 3, 3] + [1] * (len(TOKENS) - 3)
assert len(TOKENS) == 64
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def tiny_model(arch="llama", tie=False, seed=0, **config):
    """A random float32 HF model with weights large enough that a wrong layout changes the logits.
    ``config`` overrides or adds config fields (e.g. ``rope_scaling``, ``max_position_embeddings``)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rope_theta=50000.0, rms_norm_eps=1e-5, max_position_embeddings=128,
              tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
    kw.update(config)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    elif arch == "qwen3":  # head_dim 24: not hidden / heads
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**kw, head_dim=24))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.15) + (1.0 if p.ndim == 1 else 0.0))
    return model.eval()


def llama_cpp_permute(w, n_head, n_head_kv):
    """Verbatim from llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name):
    if hf_name in _GGUF_TOP:
        return _GGUF_TOP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_GGUF_LAYER[rest]}"


def _add_metadata(writer, key, value):
    """One key/value with the GGUF type llama.cpp's converter gives such a value (rope.scaling.* included)."""
    if isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    else:
        writer.add_float32(key, value)


def write_gguf(path, model, arch="llama", qtype=None, skip=(), reshape=None, architecture=None, metadata=None):
    """Writes ``model`` as llama.cpp would; 2-D tensors quantized to ``qtype`` (embedding always Q8_0 then).

    ``metadata``: extra ``<arch>.``-relative keys, e.g. ``{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}``
    (the model's own ``rope_scaling`` is not written: the caller states it as llama.cpp would).
    """
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture or arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    if getattr(cfg, "head_dim", None):
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types(TOKEN_TYPES)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for key, value in (metadata or {}).items():
        _add_metadata(writer, f"{architecture or arch}.{key}", value)
    for name, tensor in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        w = tensor.numpy().astype(np.float32)
        if arch == "llama" and "q_proj" in name:
            w = llama_cpp_permute(w, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch == "llama" and "k_proj" in name:
            w = llama_cpp_permute(w, cfg.num_attention_heads, cfg.num_key_value_heads)
        name = gguf_name(name)
        if name in skip:
            continue
        if reshape and name in reshape:
            w = reshape[name](w)
        if qtype is not None and w.ndim == 2:
            kind = gguf.GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else qtype
            writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
