"""transformers' own model for a GGUF file: the reference of parity tests and benchmarks (needs torch).

Never imported by decoding or training. It uses transformers' GGUF reader, dequantizer and Q/K
un-permutation (``load_gguf_checkpoint``, what ``from_pretrained(..., gguf_file=...)`` runs); calling it
directly avoids the ``accelerate`` dependency that ``from_pretrained`` demands for GGUF files.
"""

from __future__ import annotations


def transformers_model_from_gguf(path: str, num_layers: int):
    """A float32 ``*ForCausalLM`` in eval mode holding the GGUF file's (dequantized) weights."""
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # Only the parameter names of this skeleton are used, to map GGUF names; it holds no memory.
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=num_layers))
    parsed = load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton)
    config = transformers.AutoConfig.for_model(**parsed["config"])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(parsed["tensors"], strict=False)
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise ValueError(f"transformers could not load {path}: missing {missing}, unexpected {result.unexpected_keys}")
    model.tie_weights()
    return model.eval()
