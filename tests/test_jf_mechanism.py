"""The mechanism, end to end: training on Jacobi trajectories raises a model's Jacobi TPF (slow, ~2 min).

A tiny random model is trained with ``run_training`` (configs/tiny.yaml, widened) on the synthetic task of
``jf_jax/training/synthetic.py``: each response continues its prompt as a shifted copy, so the greedy continuation is
learnable, and the trajectories hold every stage of a block's convergence (state 0 = a random draft from the
context). Before training, greedy Jacobi decoding of a random model accepts about one token per forward; after
training, on held-out prompts, the model must (a) produce the task's continuation and (b) accept clearly more
than one token per forward (TPF = tokens / forwards, the prefill counted) with ``generate_jacobi``.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.slow

STEPS = 800
BLOCK = 4
MAX_NEW = 16


def _tpf(params, cfg, prompts):
    from jf_jax.decoding.jacobi import generate_jacobi
    from jf_jax.training.synthetic import EOS_ID

    r = generate_jacobi(params, cfg, prompts, max_new_tokens=MAX_NEW, eos_ids=(EOS_ID,), block_size=BLOCK)
    return sum(r.new_tokens) / sum(r.forwards), r.token_ids


def test_training_raises_jacobi_tpf(tmp_path):
    import jax

    from jf_jax.weights import run_dir as rd
    from jf_jax.model.params import init_params
    from jf_jax.training.synthetic import make_prompts, response_for
    from jf_jax.training.config import load_config
    from jf_jax.training.loop import run_training

    tcfg = load_config("configs/tiny.yaml", [
        f"train.steps={STEPS}", "train.ckpt_every=10000", "train.log_every=50",
        "model.config.hidden_size=64", "model.config.intermediate_size=128", "model.config.head_dim=16",
        "data.batch_size=8", "data.synthetic.num_prompts=512", "optim.warmup_steps=20"])
    s = tcfg.data.synthetic
    held_out = make_prompts(16, s.prompt_len, s.vocab_size, seed=12345)  # not among the training prompts
    train_prompts = {p.tobytes() for p in make_prompts(s.num_prompts, s.prompt_len, s.vocab_size, seed=tcfg.data.seed)}
    assert not any(p.tobytes() in train_prompts for p in held_out)

    from jf_jax.model.config import ModelConfig

    cfg = ModelConfig.from_dict(tcfg.model.config)
    before, _ = _tpf(init_params(cfg, jax.random.key(tcfg.seed)), cfg, held_out)

    result = run_training(tcfg, str(tmp_path / "run"), progress=False)
    assert result.step == STEPS
    first, last = result.metrics[1], result.metrics[STEPS]
    assert last["loss/consistency"] < 0.5 * first["loss/consistency"]
    assert last["loss/ar"] < 0.5 * first["loss/ar"]

    cfg, params = rd.load_run(str(tmp_path / "run"))
    after, tokens = _tpf(params, cfg, held_out)
    # The model learned the task: its greedy output is the task's continuation (first 8 tokens, before any EOS).
    accuracy = np.mean([np.mean(np.array((t + [-1] * 8)[:8]) == response_for(p, 8, s.vocab_size))
                        for t, p in zip(tokens, held_out)])
    print(f"TPF before {before:.3f} after {after:.3f}; held-out continuation accuracy {accuracy:.3f}")
    assert accuracy >= 0.8
    assert before < 1.3
    assert after >= 1.5 and after >= before + 0.4
