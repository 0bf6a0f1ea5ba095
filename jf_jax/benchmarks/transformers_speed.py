"""Hugging Face transformers' ``generate`` timed the way the AR benchmarks time jf-jax: one prompt at a time, a
fixed number of new tokens (EOS ignored), greedy, after a warm-up. transformers and torch are test dependencies,
imported only when called."""

from __future__ import annotations

import time


def transformers_rates(hf_model, encoded: list[list[int]], tokens: int) -> list[float]:
    """Tokens per second of ``hf_model.generate`` for each token-id prompt alone, prefill included."""
    import torch

    def generate(ids, n):
        with torch.no_grad():
            return hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    generate(encoded[0], 4)  # warm-up
    rates = []
    for ids in encoded:
        start = time.perf_counter()
        out = generate(ids, tokens)
        seconds = time.perf_counter() - start
        assert out.shape[1] - len(ids) == tokens
        rates.append(tokens / seconds)
    return rates
