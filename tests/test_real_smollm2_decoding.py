"""On the real SmolLM2-135M-Instruct weights: jacobi and mr tokens equal greedy AR tokens, in float32 and bfloat16
(bitwise: a token's logits have the same bits in a one-token step and inside a block, see model.cached_attention).

Goes through the public API, i.e. the decode view with per-core column shards, as the CLI does.
"""

import pytest

from jf_jax import api

pytestmark = pytest.mark.slow  # compiles the three decoders on the 135M model (~1-2 min)

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "If a shirt costs 15 dollars and is on sale for 20% off, what is the sale price?",
    "List two benefits of regular exercise.",
]


@pytest.mark.parametrize("dtype,block_size", [("float32", 8), ("bfloat16", 16)])
def test_parallel_decoders_equal_ar_on_real_weights(smollm2, smollm2_bf16, dtype, block_size):
    model = smollm2 if dtype == "float32" else smollm2_bf16
    ar = api.generate(model, PROMPTS, method="ar", max_new_tokens=40)
    jacobi = api.generate(model, PROMPTS, method="jacobi", max_new_tokens=40, block_size=block_size, seed=1)
    mr = api.generate(model, PROMPTS, method="mr", max_new_tokens=40, block_size=block_size, num_blocks=2,
                      spawn_ratio=0.85, pool_size=3, seed=2)
    for a, j, m in zip(ar, jacobi, mr):
        assert a.new_tokens >= 20
        assert j.token_ids == a.token_ids, (a.text, j.text)
        assert m.token_ids == a.token_ids, (a.text, m.text)
        # Untrained model: about one token per forward (the paper's plain-Jacobi row), never fewer.
        assert 1.0 <= j.new_tokens / j.forwards < 2.0
        assert m.new_tokens / m.forwards >= 1.0
