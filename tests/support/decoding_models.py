"""Small models for the decoding tests: random ones, and "predictable" ones whose greedy next token is a fixed
function of the current token.

Every model here has the same config (``CFG``), so the jitted decoders compile once per decoder setting and
the weights (traced arguments) vary freely between hypothesis examples. Compilation dominates test time on
CPU, so tests draw decoder settings from short fixed lists.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jf_jax.decoding.ar import generate_ar
from jf_jax.model.config import ModelConfig
from jf_jax.model.transformer import forward_logits
from jf_jax.model.params import init_params

VOCAB = 64
CFG = ModelConfig(architecture="llama", vocab_size=VOCAB, hidden_size=VOCAB, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, attention_bias=False, tie_word_embeddings=False)
MAX_PROMPT = 16  # one prompt bucket
MAX_NEW = 16  # one output bucket


def random_params(seed: int, embed_scale: float = 4.0):
    """Random weights; a larger embedding scale makes the greedy continuation vary more between tokens."""
    params = init_params(CFG, jax.random.PRNGKey(seed))
    return {**params, "embed": params["embed"] * embed_scale}


def successor_params(successor, seed: int = 0):
    """Weights whose greedy next token is ``successor[current token]``, whatever the context.

    One-hot embeddings (hidden size == vocab), zeroed attention and MLP outputs (the residual stream keeps the
    embedding; the attention and MLP still run, on their random q/k/v and gate/up weights), and an lm_head that
    maps the normalised one-hot of token t to a logit of sqrt(D) on ``successor[t]`` and 0 elsewhere.
    """
    successor = np.asarray(successor)
    assert successor.shape == (VOCAB,)
    params = init_params(CFG, jax.random.PRNGKey(seed))
    layers = dict(params["layers"])
    layers["wo"] = jnp.zeros_like(layers["wo"])
    layers["w_down"] = jnp.zeros_like(layers["w_down"])
    lm_head = np.zeros((VOCAB, VOCAB), np.float32)
    lm_head[np.arange(VOCAB), successor] = 1.0
    return {**params, "layers": layers, "embed": jnp.eye(VOCAB, dtype=jnp.float32), "lm_head": jnp.asarray(lm_head)}


def into_set_map(targets, seed: int):
    """A successor map with image ``targets``: every token goes to a (seeded) random member of ``targets``."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.asarray(targets), size=VOCAB)


def cycle_map(cycle):
    """Tokens of ``cycle`` follow it round; every other token goes to ``cycle[0]``."""
    successor = np.full(VOCAB, cycle[0])
    for a, b in zip(cycle, list(cycle[1:]) + [cycle[0]]):
        successor[a] = b
    return successor


def eos_cases():
    """(params, prompts) of predictable models for the EOS tests: outputs in a 3-token set (drafts often match,
    so EOS lands in accepted prefixes), and the chain t -> t+1 (one new token per iteration, so an EOS at
    output position k lands in a correction token, or in a block's bonus token when k is a multiple of n)."""
    for map_seed in range(2):
        yield successor_params(into_set_map([7, 11, 13], map_seed)), ([1, 2, 3], [7, 11, 13, 7, 11, 13, 40])
    yield successor_params((np.arange(VOCAB) + 1) % VOCAB), ([10],)


def ar_tokens(params, prompt, max_new_tokens: int, eos_ids=()) -> list[int]:
    """Ground truth: greedy AR decoding of one prompt."""
    return generate_ar(params, CFG, [list(prompt)], max_new_tokens=max_new_tokens, eos_ids=list(eos_ids),
                       warmup=False).token_ids[0]


_FULL_LEN = 64


@functools.partial(jax.jit)
def _full_greedy(params, tokens):
    logits, _ = forward_logits(params, CFG, tokens[None])
    return jnp.argmax(logits[0], axis=-1)


def jacobi_update(params, context, block) -> np.ndarray:
    """One Jacobi iteration without a KV cache: the greedy tokens of ``block``'s positions given
    ``context ++ block`` (a plain causal forward; trailing padding cannot affect earlier positions)."""
    context, block = np.asarray(context), np.asarray(block)
    seq = np.concatenate([context, block])
    assert seq.size <= _FULL_LEN
    preds = np.asarray(_full_greedy(params, jnp.asarray(np.pad(seq, (0, _FULL_LEN - seq.size)), jnp.int32)))
    return preds[context.size - 1: context.size - 1 + block.size]
