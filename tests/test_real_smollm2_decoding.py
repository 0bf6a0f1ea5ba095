"""On the real SmolLM2-135M-Instruct weights: jacobi and mr tokens equal greedy AR tokens, in float32, bfloat16 and
int8, alone and batched (bitwise: a token's logits have the same bits in a one-token step and inside a block, in
any batch, see model.cached_attention and model.quantize).

Goes through the public API, i.e. the decode view with per-core column shards, as the CLI does.
"""

import pytest

from jf_jax import api

# slow: compiles the three decoders on the 135M model (~1-2 min); on a GPU, the decoders' own precision
pytestmark = [pytest.mark.slow, pytest.mark.library_precision]

MAX_NEW = 28  # enough for several blocks of 8 or 16 past the prefill; decoding, not compiling, grows with it
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "If a shirt costs 15 dollars and is on sale for 20% off, what is the sale price?",
    "List two benefits of regular exercise.",
]


@pytest.mark.parametrize("dtype,block_size,mr_batch", [("float32", 8, 1), ("bfloat16", 16, 3), ("int8", 8, 3)])
def test_parallel_decoders_equal_ar_on_real_weights(smollm2, smollm2_bf16, smollm2_int8, dtype, block_size,
                                                    mr_batch):
    """AR one prompt at a time is the reference; mr decodes the prompts as one batch in bfloat16 and int8."""
    model = {"float32": smollm2, "bfloat16": smollm2_bf16, "int8": smollm2_int8}[dtype]
    ar = api.generate(model, PROMPTS, method="ar", max_new_tokens=MAX_NEW)
    jacobi = api.generate(model, PROMPTS, method="jacobi", max_new_tokens=MAX_NEW, block_size=block_size, seed=1)
    mr = api.generate(model, PROMPTS, method="mr", max_new_tokens=MAX_NEW, block_size=block_size, num_blocks=2,
                      spawn_ratio=0.85, pool_size=3, seed=2, batch_size=mr_batch)
    assert all(m.batch_size == mr_batch for m in mr)
    for a, j, m in zip(ar, jacobi, mr):
        assert a.new_tokens >= 20
        assert j.token_ids == a.token_ids, (a.text, j.text)
        assert m.token_ids == a.token_ids, (a.text, m.text)
        # Untrained model: about one token per forward (the paper's plain-Jacobi row); at worst one forward more
        # than AR (the prefill's token is emitted with the first iteration's), never fewer tokens per forward.
        assert j.forwards <= j.new_tokens + 1 and j.new_tokens / j.forwards < 2.0
        assert m.forwards <= m.new_tokens + 1


def test_sampled_tokens_equal_across_methods_on_real_weights(smollm2_bf16):
    """T = 0.7, top-p 0.95: jacobi and mr (batched) sample exactly AR's tokens for the same seed."""
    sampling = dict(temperature=0.7, top_p=0.95, seed=5)
    ar = api.generate(smollm2_bf16, PROMPTS, method="ar", max_new_tokens=MAX_NEW, **sampling)
    jacobi = api.generate(smollm2_bf16, PROMPTS, method="jacobi", max_new_tokens=MAX_NEW, block_size=8, **sampling)
    mr = api.generate(smollm2_bf16, PROMPTS, method="mr", max_new_tokens=MAX_NEW, block_size=8, num_blocks=2,
                      spawn_ratio=0.85, pool_size=3, batch_size=3, **sampling)
    greedy = api.generate(smollm2_bf16, PROMPTS, method="ar", max_new_tokens=MAX_NEW)
    assert [j.token_ids for j in jacobi] == [a.token_ids for a in ar] == [m.token_ids for m in mr]
    assert [g.token_ids for g in greedy] != [a.token_ids for a in ar]  # the noise is really there
