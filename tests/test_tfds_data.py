"""Trajectories and prompt sets as TFDS array_record data sources: the same records as the npz reader, read without
TensorFlow; deterministic shuffling and sharding over data-parallel processes."""

import json
import sys

import numpy as np
import pytest

from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
from jf_jax.training.tfds_data import (ShardedOrder, build_prompts, build_trajectories, prompt_source, to_record,
                                       trajectory_source)
from jf_jax.training.trajectories import collect, iter_records
from tests.conftest import require

require("tensorflow_datasets")
N = 4


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("traj"))
    prompts = make_prompts(7, 5, 40, seed=2)
    collect(prompts, SyntheticRecorder(block_size=N, num_blocks=3, vocab_size=40), out, block_size=N,
            prompts_per_shard=3, progress=False)
    build_trajectories(out)
    return out


def test_the_data_source_holds_the_npz_records_in_order(trajectories):
    source = trajectory_source(trajectories)
    expected = list(iter_records(trajectories))
    assert len(source) == len(expected) == 21
    for i in (20, 0, 7, 13):  # random access, any order
        got, want = to_record(source[i]), expected[i]
        assert (got.example_id, got.block_index) == (want.example_id, want.block_index)
        np.testing.assert_array_equal(got.prompt_ids, want.prompt_ids)
        np.testing.assert_array_equal(got.states, want.states)
    assert "tensorflow" not in sys.modules  # TFDS reads array_record with numpy alone
    build_trajectories(trajectories)  # a second build reuses the prepared dataset


def test_an_unfinished_collection_is_not_converted(tmp_path):
    prompts = make_prompts(4, 5, 40, seed=3)
    out = str(tmp_path / "t")

    def dying(prompt):
        if dying.calls == 2:
            raise KeyboardInterrupt
        dying.calls += 1
        return SyntheticRecorder(block_size=N, num_blocks=2, vocab_size=40)(prompt)

    dying.calls = 0
    with pytest.raises(KeyboardInterrupt):
        collect(prompts, dying, out, block_size=N, prompts_per_shard=2, progress=False)
    with pytest.raises(ValueError, match="holds 2 of 4 prompts"):
        build_trajectories(out)
    with pytest.raises(FileNotFoundError, match="no TFDS dataset"):
        trajectory_source(out)


def test_prompt_sets_round_trip(tmp_path):
    rows = [dict(id="a", domain="code", prompt="def f():\n    ☃"),
            dict(id="b", domain="math", prompt="2+2?", answer="4")]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data_dir = str(tmp_path / "tfds")
    build_prompts(str(path), data_dir)
    source = prompt_source(data_dir)
    assert len(source) == 2
    assert source[1] == dict(id="b", domain="math", prompt="2+2?", answer="4")
    assert source[0] == dict(id="a", domain="code", prompt="def f():\n    ☃", answer="")


def test_sharded_order_is_deterministic_disjoint_and_even():
    orders = [ShardedOrder(23, seed=5, process_index=i, process_count=4) for i in range(4)]
    epoch0 = [o.indices(0) for o in orders]
    assert all(len(ix) == 5 for ix in epoch0)  # 23 // 4; the 3 left over sit out this epoch
    flat = np.concatenate(epoch0)
    assert len(set(flat.tolist())) == 20 and flat.min() >= 0 and flat.max() < 23
    assert all(np.array_equal(o.indices(0), ShardedOrder(23, 5, i, 4).indices(0)) for i, o in enumerate(orders))
    assert not np.array_equal(orders[0].indices(0), orders[0].indices(1))  # another epoch, another order
    assert not np.array_equal(orders[0].indices(0), ShardedOrder(23, 6, 0, 4).indices(0))
    single = ShardedOrder(23, seed=5).indices(3)
    assert sorted(single.tolist()) == list(range(23))
    with pytest.raises(ValueError, match="process_index"):
        ShardedOrder(10, 0, process_index=2, process_count=2)
    with pytest.raises(ValueError, match="cannot feed"):
        ShardedOrder(3, 0, process_count=4)
