"""Trajectory format round trip, resumable collection, fingerprint check and repetition filter."""

import json
import os

import numpy as np
import pytest

from jf_jax.training.synthetic import SyntheticRecorder, make_prompts
from jf_jax.training.trajectories import (Record, TrajectoryFormatError, collect, iter_records, load_responses,
                                          read_shard, repetition_filter, write_shard)

N = 4


def test_shard_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    records = [Record(int(e), int(j), rng.integers(0, 99, int(rng.integers(1, 9))).astype(np.int32),
                      rng.integers(0, 99, (int(rng.integers(1, 6)), N)).astype(np.int32))
               for e, j in [(0, 0), (0, 1), (3, 0), (7, 2)]]
    path = str(tmp_path / "s.npz")
    write_shard(path, records, N)
    back = read_shard(path)
    assert len(back) == len(records)
    for a, b in zip(records, back):
        assert (a.example_id, a.block_index) == (b.example_id, b.block_index)
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.fixed_point, b.states[-1])
    write_shard(path, [], N)
    assert read_shard(path) == []
    with pytest.raises(TrajectoryFormatError):
        write_shard(path, [Record(0, 0, np.zeros(2, np.int32), np.zeros((2, N + 1), np.int32))], N)


def test_collect_layout_and_records(tmp_path):
    prompts = make_prompts(5, 6, 40, seed=1)
    recorder = SyntheticRecorder(block_size=N, num_blocks=3, vocab_size=40)
    manifest = collect(prompts, recorder, str(tmp_path), block_size=N, prompts_per_shard=2, progress=False)
    assert [(s["prompt_start"], s["prompt_end"]) for s in manifest["shards"]] == [(0, 2), (2, 4), (4, 5)]
    responses = load_responses(str(tmp_path))  # also checks prompt_j = prompt ++ fixed points < j
    assert len(responses) == 5
    for eid, recs in enumerate(responses):
        blocks = recorder(prompts[eid])
        assert len(recs) == 3
        np.testing.assert_array_equal(recs[0].prompt_ids, prompts[eid])
        for rec, states in zip(recs, blocks):
            np.testing.assert_array_equal(rec.states, states)
            assert rec.states[0][0] == rec.fixed_point[0]  # state 0: known-correct token + random draft
            assert not np.array_equal(rec.states[0], rec.fixed_point) or N == 1


def test_killed_collection_resumes_where_it_stopped(tmp_path):
    prompts = make_prompts(7, 5, 40, seed=2)
    recorder = SyntheticRecorder(block_size=N, num_blocks=2, vocab_size=40)
    calls = []

    def dying(prompt):
        if len(calls) == 5:
            raise KeyboardInterrupt  # killed while working on prompt 5 (shard [4, 6) incomplete)
        calls.append(tuple(prompt))
        return recorder(prompt)

    out = str(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        collect(prompts, dying, out, block_size=N, prompts_per_shard=2, progress=False)
    assert [s["prompt_end"] for s in json.load(open(os.path.join(out, "manifest.json")))["shards"]] == [2, 4]
    seen = []
    collect(prompts, lambda p: seen.append(tuple(p)) or recorder(p), out, block_size=N, prompts_per_shard=2,
            progress=False)
    assert seen == [tuple(p) for p in prompts[4:]]  # only the unfinished prompts are recollected

    ref = str(tmp_path / "uninterrupted")
    collect(prompts, recorder, ref, block_size=N, prompts_per_shard=2, progress=False)
    got, want = list(iter_records(out)), list(iter_records(ref))
    assert len(got) == len(want) == 14
    for a, b in zip(got, want):
        assert (a.example_id, a.block_index) == (b.example_id, b.block_index)
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)

    with pytest.raises(TrajectoryFormatError, match="prompts_sha256"):
        collect(prompts[::-1], recorder, out, block_size=N, progress=False)
    with pytest.raises(TrajectoryFormatError, match="block_size"):
        collect(prompts, recorder, out, block_size=N * 2, progress=False)


def test_repetition_filter(tmp_path):
    keep = repetition_filter(ngram=2, max_repeat_fraction=0.5, eos_id=1)
    assert keep([5, 6, 7, 8, 9, 10])
    assert not keep([5, 6, 5, 6, 5, 6, 5, 6])  # 7 bigrams, 2 distinct
    assert keep([5, 6, 7, 8, 1, 4, 4, 4, 4, 4, 4])  # the junk after EOS does not count

    prompts = make_prompts(4, 5, 40, seed=3)
    recorder = SyntheticRecorder(block_size=N, num_blocks=2, vocab_size=40)
    degenerate = lambda p: [np.array([[7] * N, [7] * N])] * 3 if np.array_equal(p, prompts[2]) else recorder(p)  # noqa: E731
    manifest = collect(prompts, degenerate, str(tmp_path), block_size=N, keep_fn=repetition_filter(), progress=False)
    assert sum(s["num_filtered"] for s in manifest["shards"]) == 1
    assert sorted({r.example_id for r in iter_records(str(tmp_path))}) == [0, 1, 3]


def test_record_fn_may_return_objects_with_states(tmp_path):
    class Block:  # the shape of jf_jax.decoding.recording.BlockTrajectory
        def __init__(self, states):
            self.states = states

    prompts = make_prompts(2, 5, 40, seed=4)
    recorder = SyntheticRecorder(block_size=N, num_blocks=2, vocab_size=40)
    collect(prompts, lambda p: [Block(s) for s in recorder(p)], str(tmp_path), block_size=N, progress=False)
    for recs, prompt in zip(load_responses(str(tmp_path)), prompts):
        for rec, states in zip(recs, recorder(prompt)):
            np.testing.assert_array_equal(rec.states, states)
