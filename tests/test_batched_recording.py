"""The batched trajectory recorder (``decoding.batch_recording.record_batch``: greedy responses by batched AR, then
every block of every response as its own row, resumed from the AR cache) gives every block exactly the trajectory the
one-prompt recorder gives it: the same random draft, the same iterates, the same fixed point, whatever the batch size
or the prompts beside it."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from jf_jax.decoding.batch_recording import record_batch
from jf_jax.decoding.common import GenerationError
from jf_jax.decoding.shapes import DecodeShape
from jf_jax.decoding.recording import record_trajectories
from tests.support.decoding_models import CFG, VOCAB, ar_tokens, random_params

pytestmark = pytest.mark.library_precision  # on a GPU: the decoders' own precision

PROMPTS = [[4, 8, 15, 16, 23, 42], [1, 2], [7] * 11, [3, 9, 27, 81 % VOCAB, 5, 5, 5, 2, 1]]


def _sequential(params, prompts, *, block_size, max_new, eos=(), seed=0, indices=None):
    indices = range(len(prompts)) if indices is None else indices
    return [record_trajectories(params, CFG, p, block_size=block_size, max_new_tokens=max_new, eos_ids=eos,
                                seed=seed, prompt_index=i) for p, i in zip(prompts, indices)]


def _assert_same(batched, sequential):
    assert len(batched) == len(sequential)
    for b, s in zip(batched, sequential):
        assert not b.mismatched
        assert len(b.blocks) == len(s)
        for got, want in zip(b.blocks, s):
            np.testing.assert_array_equal(got.prompt_ids, want.prompt_ids)
            np.testing.assert_array_equal(got.states, want.states)


@pytest.mark.parametrize("block_size, batch_size", [(3, 1), (3, 5), (8, 4)])
def test_batched_blocks_are_the_sequential_recorders(block_size, batch_size):
    params = random_params(11, 8.0)
    want = _sequential(params, PROMPTS, block_size=block_size, max_new=14, seed=1)
    got = record_batch(params, CFG, PROMPTS, block_size=block_size, max_new_tokens=14, seed=1,
                       batch_size=batch_size)
    _assert_same(got, want)
    # The drafts are really random (not the fixed points) and the iteration really ran more than one step.
    assert any(not np.array_equal(b.states[0], b.fixed_point) for r in got for b in r.blocks)
    assert max(b.states.shape[0] for r in got for b in r.blocks) > 2


def test_batched_recording_stops_after_the_eos_block_and_keeps_prompt_indices():
    params = random_params(5, 8.0)
    free = ar_tokens(params, [1, 2], 16)
    eos = (free[5],)
    prompts = [[1, 2], [6, 1, 4]]
    want = _sequential(params, prompts, block_size=3, max_new=15, eos=eos, seed=2, indices=[40, 7])
    got = record_batch(params, CFG, prompts, block_size=3, max_new_tokens=15, eos_ids=eos, seed=2,
                       prompt_indices=[40, 7], batch_size=3)
    _assert_same(got, want)
    assert len(got[0].blocks) == free.index(eos[0]) // 3 + 1


@pytest.mark.parametrize("shape", [DecodeShape(1, 8), DecodeShape(2, 16)])
def test_padded_batched_blocks_are_the_sequential_recorders(shape):
    """At a fixed decode shape (what GPUs and TPUs run) the AR pass and the block rows still give every block
    the one-prompt recorder's trajectory."""
    params = random_params(11, 8.0)
    want = _sequential(params, PROMPTS, block_size=4, max_new=14, seed=3)
    got = record_batch(params, CFG, PROMPTS, block_size=4, max_new_tokens=14, seed=3, batch_size=3,
                       decode_shape=shape)
    _assert_same(got, want)


def test_every_forward_of_the_padded_recorder_has_one_shape(monkeypatch):
    """Traced token shapes of the recorder at a fixed shape: one prefill shape (AR's and block 0's drafting
    prefill) and one step shape (AR's steps and every block row's iterations), the cache capacity shared. The
    block rows forward no context: no trace is as long as a prompt plus earlier blocks."""
    from jf_jax.model.params import init_params
    from tests.support.traces import record_stack_traces

    traced = record_stack_traces(monkeypatch)
    cfg = dataclasses.replace(CFG, num_layers=1, num_kv_heads=1)  # a config no other test compiles
    params = init_params(cfg, jax.random.PRNGKey(0))
    shape = DecodeShape(1, 8)
    got = record_batch(params, cfg, PROMPTS, block_size=4, max_new_tokens=20, batch_size=2, decode_shape=shape)
    assert max(len(r.blocks) for r in got) > 2  # later blocks were resumed from the AR cache
    prompt_bucket = 16
    capacity = 64  # prompt bucket 16 + output bucket 32 + the width 8, rounded up to a whole 64-slot attention chunk
    assert set(traced) == {((2, prompt_bucket + shape.width), capacity, True), ((2, shape.width), capacity, True)}


def test_a_shape_narrower_than_the_block_is_refused():
    with pytest.raises(GenerationError, match="1x4"):
        record_batch(random_params(1, 1.0), CFG, PROMPTS, block_size=8, max_new_tokens=8,
                     decode_shape=DecodeShape(1, 4))


def test_batched_recording_rejects_mismatched_indices():
    with pytest.raises(ValueError, match="prompt_indices"):
        record_batch(random_params(1, 1.0), CFG, PROMPTS, block_size=3, max_new_tokens=6, prompt_indices=[0])


TWO_DEVICES = """
import numpy as np, jax
from jf_jax.decoding.batch_recording import record_batch
from jf_jax.decoding.recording import record_trajectories
from tests.support.decoding_models import CFG, random_params
assert jax.local_device_count() == 2
params = random_params(11, 8.0)
prompts = [[4, 8, 15, 16, 23, 42], [1, 2], [7] * 11]
got = record_batch(params, CFG, prompts, block_size=3, max_new_tokens=6, seed=1, batch_size=3)  # rounded up to 4
for i, (p, r) in enumerate(zip(prompts, got)):
    want = record_trajectories(params, CFG, p, block_size=3, max_new_tokens=6, seed=1, prompt_index=i)
    assert len(r.blocks) == len(want) and all(np.array_equal(a.states, b.states) for a, b in zip(r.blocks, want))
print("same")
"""


def test_rows_split_over_two_devices_record_the_same_trajectories():
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", TWO_DEVICES], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]


def test_training_reads_every_process_directory_of_a_multi_process_collection(tmp_path):
    from jf_jax.training.trajectories import TrajectoryFormatError, process_dir, trajectory_dirs

    parts = [process_dir(str(tmp_path), i, 2) for i in range(2)]
    for d in parts:
        os.makedirs(d)
    assert trajectory_dirs(str(tmp_path)) == parts
    os.rmdir(parts[1])
    with pytest.raises(TrajectoryFormatError, match="multi-process"):
        trajectory_dirs(str(tmp_path))
