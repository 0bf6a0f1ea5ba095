"""Shared helpers of the training tests: tiny configs and a compile-free parameter init."""

import math

import jax
import numpy as np

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import ParamSpec, param_specs

TINY = ModelConfig(architecture="qwen2", vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                   max_position_embeddings=256, attention_bias=True, tie_word_embeddings=False)


def numpy_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random parameters with the layout of ``init_params`` drawn by numpy (no XLA compile: fast tests)."""
    rng = np.random.default_rng(seed)

    def one(spec: ParamSpec):
        if spec.init == "ones":
            return np.ones(spec.shape, np.float32)
        if spec.init == "zeros":
            return np.zeros(spec.shape, np.float32)
        return (rng.standard_normal(spec.shape) / math.sqrt(spec.fan_in)).astype(np.float32)

    return jax.tree.map(one, param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))


def synthetic_batch(vocab_size: int, num_prompts: int, bucket: int) -> dict:
    """One packed host batch of ``num_prompts`` synthetic Jacobi-trajectory examples (n = 4, 3 blocks each)."""
    from jf_jax.training.packing import BatchStream, example_from_records, pack_example
    from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
    from jf_jax.training.trajectories import Record

    recorder = SyntheticRecorder(block_size=4, num_blocks=3, vocab_size=vocab_size)
    seqs = []
    for eid, prompt in enumerate(make_prompts(num_prompts, 6, vocab_size, seed=0)):
        context, recs = prompt, []
        for j, states in enumerate(recorder(prompt)):
            recs.append(Record(eid, j, context, states))
            context = np.concatenate([context, states[-1]])
        seqs.append(pack_example(example_from_records(recs, 4), eos_id=1, pad_id=0))
    return BatchStream(seqs, batch_size=num_prompts, buckets=[bucket], pad_id=0).batch(0)
