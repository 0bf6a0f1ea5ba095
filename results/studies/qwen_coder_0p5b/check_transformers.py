"""jf-jax's Qwen2.5-Coder-0.5B-Instruct against transformers reading the same assembled GGUF (its own GGUF loader):
tokenizer ids, chat template, float32 logits. Needs torch, transformers and accelerate (transformers' GGUF loader
requires it; it is no jf-jax dependency: `pip install --target DIR --no-deps accelerate` and PYTHONPATH=DIR).

    PYTHONPATH=DIR python results/studies/qwen_coder_0p5b/check_transformers.py > check_transformers.json
"""

import json
import os

import jax.numpy as jnp
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jf_jax.model import transformer
from jf_jax.weights import load, resolve

_, path, _ = resolve("qwen2.5-coder-0.5b")  # assembles the GGUF into the weights cache if needed
folder, name = os.path.dirname(path), os.path.basename(path)
ours = load("qwen2.5-coder-0.5b")
theirs_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
texts = ["def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)", "Hello, 世界! 12345  tabs\tand\r\nCRLF",
         "   leading spaces and émojis 🎉🎉", "x = [i**2 for i in range(10)]  # squares\n\n\n", "ÅÄÖ café naïve"]
chats = [[{"role": "user", "content": "Write a C function that reverses a linked list."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "sort a list in C"}]]
report = {
    "tokenizer_equal": [ours.tokenizer.encode(t) == theirs_tok.encode(t, add_special_tokens=False) for t in texts],
    "template_equal": [ours.tokenizer.apply_chat_template(c)
                       == theirs_tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                       for c in chats],
}
ids = ours.tokenizer.encode(ours.tokenizer.apply_chat_template(chats[0]))
theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
with torch.no_grad():
    ref = theirs(torch.tensor([ids])).logits[0].numpy()
mine = np.asarray(transformer.forward_logits(ours.params, ours.cfg, jnp.asarray([ids]))[0])[0]
report.update(transformers_tie_word_embeddings=theirs.config.tie_word_embeddings, positions=len(ids),
              max_abs_logit_diff=float(np.abs(mine - ref).max()), max_abs_logit=float(np.abs(ref).max()),
              argmax_equal=int((mine.argmax(-1) == ref.argmax(-1)).sum()))
print(json.dumps(report))
