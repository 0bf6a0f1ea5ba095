"""Packed layout, per-token mask data and targets (docs/method.md, sections 4-5 and decision 5).

The mask is checked against an enumeration written from the rule's text (docs/method.md, section 4, and the ablation
mask), not from ``pallas_kernels.mask.allowed``, and against the worked example P=3, T=2, n=4 verbatim.
"""

import numpy as np
import pytest

from jf_jax.training.packing import (BatchStream, Example, assign_rows, bucket_for, make_batch, pack_ar_example,
                                     pack_example)
from pallas_kernels.mask import MASK_CLEAN_CONTEXT, MASK_NOISE_CONDITIONED, TokenMeta, dense_mask

WORKED_EXAMPLE = """
       p0 p1 p2 ~0.0 ~0.1 ~0.2 ~0.3 *0.0 *0.1 *0.2 *0.3 ~1.0 ~1.1 ~1.2 ~1.3 *1.0 *1.1 *1.2 *1.3
 p0     1  .  .   .    .    .    .    .    .    .    .    .    .    .    .    .    .    .    .
 p1     1  1  .   .    .    .    .    .    .    .    .    .    .    .    .    .    .    .    .
 p2     1  1  1   .    .    .    .    .    .    .    .    .    .    .    .    .    .    .    .
 ~0.0   1  1  1   1    .    .    .    .    .    .    .    .    .    .    .    .    .    .    .
 ~0.1   1  1  1   1    1    .    .    .    .    .    .    .    .    .    .    .    .    .    .
 ~0.2   1  1  1   1    1    1    .    .    .    .    .    .    .    .    .    .    .    .    .
 ~0.3   1  1  1   1    1    1    1    .    .    .    .    .    .    .    .    .    .    .    .
 *0.0   1  1  1   .    .    .    .    1    .    .    .    .    .    .    .    .    .    .    .
 *0.1   1  1  1   .    .    .    .    1    1    .    .    .    .    .    .    .    .    .    .
 *0.2   1  1  1   .    .    .    .    1    1    1    .    .    .    .    .    .    .    .    .
 *0.3   1  1  1   .    .    .    .    1    1    1    1    .    .    .    .    .    .    .    .
 ~1.0   1  1  1   1    1    1    1    .    .    .    .    1    .    .    .    .    .    .    .
 ~1.1   1  1  1   1    1    1    1    .    .    .    .    1    1    .    .    .    .    .    .
 ~1.2   1  1  1   1    1    1    1    .    .    .    .    1    1    1    .    .    .    .    .
 ~1.3   1  1  1   1    1    1    1    .    .    .    .    1    1    1    1    .    .    .    .
 *1.0   1  1  1   .    .    .    .    1    1    1    1    .    .    .    .    1    .    .    .
 *1.1   1  1  1   .    .    .    .    1    1    1    1    .    .    .    .    1    1    .    .
 *1.2   1  1  1   .    .    .    .    1    1    1    1    .    .    .    .    1    1    1    .
 *1.3   1  1  1   .    .    .    .    1    1    1    1    .    .    .    .    1    1    1    1
"""


def _example(P, T, n, seed=0, vocab=50):
    rng = np.random.default_rng(seed)
    clean = rng.integers(3, vocab, (T, n)).astype(np.int32)
    noisy = clean.copy()
    for j in range(T):  # diverge from a random offset (or not at all)
        f = int(rng.integers(0, n + 1))
        noisy[j, f:] = rng.integers(3, vocab, n - f)
        if f < n:
            noisy[j, f] = clean[j, f] + 1
    return Example(rng.integers(3, vocab, P).astype(np.int32), noisy, clean)


def _meta(batch):
    return TokenMeta(*(batch[k] for k in ("position", "segment", "stream", "block")))


def _labels(P, T, n):
    """('p', i) / ('noisy', j, i) / ('clean', j, i) for each packed index, from the layout of section 4.1."""
    labels = [("p", i) for i in range(P)]
    for j in range(T):
        labels += [("noisy", j, i) for i in range(n)] + [("clean", j, i) for i in range(n)]
    return labels


def _spec_allowed(q, k, kind):
    """Section 4.3 (noise-conditioned) and 4.4 (clean-context) in words, one case at a time."""
    if q[0] == "p":
        return k[0] == "p" and k[1] <= q[1]
    if k[0] == "p":
        return True  # both streams see the whole prompt
    _, qj, qi = q
    _, kj, ki = k
    same_block_causal = k[0] == q[0] and kj == qj and ki <= qi
    if q[0] == "clean":
        return same_block_causal or (k[0] == "clean" and kj < qj)
    earlier = "noisy" if kind == MASK_NOISE_CONDITIONED else "clean"
    return same_block_causal or (k[0] == earlier and kj < qj)


def _brute_force(rows, row_len, kind):
    """Dense [B, L, L] mask of rows of (P, T, n) sequences: other segments and padding never visible."""
    out = np.zeros((len(rows), row_len, row_len), bool)
    for b, row in enumerate(rows):
        start = 0
        for P, T, n in row:
            labels = _labels(P, T, n)
            for qi, q in enumerate(labels):
                for ki, k in enumerate(labels):
                    out[b, start + qi, start + ki] = _spec_allowed(q, k, kind)
            start += len(labels)
    return out


def _parse_worked_example():
    lines = [ln.split() for ln in WORKED_EXAMPLE.strip().splitlines()]
    return np.array([[c == "1" for c in ln[1:]] for ln in lines[1:]])


def test_worked_example_matrix_and_positions():
    seq = pack_example(_example(3, 2, 4), eos_id=None, pad_id=0)
    batch = make_batch([[seq]], 19, pad_id=0)
    mask = np.asarray(dense_mask(_meta(batch), _meta(batch), MASK_NOISE_CONDITIONED))[0]
    expected = _parse_worked_example()
    assert expected.shape == (19, 19)
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(seq.position, [0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 6, 7, 8, 9, 10, 7, 8, 9, 10])
    np.testing.assert_array_equal(seq.stream, [0] * 3 + [1] * 4 + [2] * 4 + [1] * 4 + [2] * 4)
    np.testing.assert_array_equal(seq.block, [-1] * 3 + [0] * 8 + [1] * 8)


@pytest.mark.parametrize("seed", range(4))
def test_noise_conditioned_mask_equals_brute_force_on_padded_multi_segment_batches(seed):
    rng = np.random.default_rng(seed)
    shapes = [(int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 5))) for _ in range(5)]
    seqs = [pack_example(_example(*s, seed=seed * 10 + i), eos_id=None, pad_id=0) for i, s in enumerate(shapes)]
    row_len = 64
    rows_idx = assign_rows([len(s) for s in seqs], row_len)
    batch = make_batch([[seqs[i] for i in r] for r in rows_idx], row_len, pad_id=0, batch_size=len(rows_idx) + 1)
    got = np.asarray(dense_mask(_meta(batch), _meta(batch), MASK_NOISE_CONDITIONED))
    want = _brute_force([[shapes[i] for i in r] for r in rows_idx] + [[]], row_len, MASK_NOISE_CONDITIONED)
    np.testing.assert_array_equal(got, want)
    assert (batch["segment"][-1] == -1).all() and (batch["ar_weight"][-1] == 0).all()


def test_clean_context_mask_equals_brute_force():
    seq = pack_example(_example(3, 3, 4, seed=1), eos_id=None, pad_id=0)
    batch = make_batch([[seq]], len(seq), pad_id=0)
    got = np.asarray(dense_mask(_meta(batch), _meta(batch), MASK_CLEAN_CONTEXT))
    np.testing.assert_array_equal(got, _brute_force([[(3, 3, 4)]], len(seq), MASK_CLEAN_CONTEXT))


def test_targets_without_eos():
    ex = Example(np.array([10, 11, 12], np.int32), np.array([[20, 9, 9, 9], [30, 31, 32, 33]], np.int32),
                 np.array([[20, 21, 22, 23], [30, 31, 32, 33]], np.int32))
    seq = pack_example(ex, eos_id=1, pad_id=0, train_prompt=True)
    # packed: p 0..2 | noisy0 3..6 | clean0 7..10 | noisy1 11..14 | clean1 15..18
    pairs = {int(i): int(seq.ar_target[i]) for i in np.flatnonzero(seq.ar_weight)}
    assert pairs == {0: 11, 1: 12, 2: 20, 7: 21, 8: 22, 9: 23, 10: 30, 15: 31, 16: 32, 17: 33}
    # block 0 diverges at offset 1 -> students 4..6 vs teachers 8..10; block 1 has no divergence.
    np.testing.assert_array_equal(seq.cons_student, [4, 5, 6])
    np.testing.assert_array_equal(seq.cons_teacher, [8, 9, 10])
    np.testing.assert_allclose(seq.cons_weight, [0.5] * 3)
    no_prompt = pack_example(ex, eos_id=1, pad_id=0, train_prompt=False)
    assert set(np.flatnonzero(no_prompt.ar_weight)) == set(pairs) - {0, 1}


def test_eos_truncates_blocks_flips_clean_to_pad_and_masks_post_eos_students():
    EOS, PAD = 1, 0
    clean = np.array([[20, 21, 22, 23], [30, EOS, 32, 33], [40, 41, 42, 43]], np.int32)
    noisy = np.array([[20, 21, 22, 23], [9, 9, 9, 9], [9, 9, 9, 9]], np.int32)
    seq = pack_example(Example(np.array([10, 11], np.int32), noisy, clean), eos_id=EOS, pad_id=PAD)
    # EOS at response index 5 (block 1): block 2 dropped, T = 2; clean1 after EOS -> PAD.
    assert len(seq) == 2 + 2 * 2 * 4
    np.testing.assert_array_equal(seq.tokens[14:18], [30, EOS, PAD, PAD])
    np.testing.assert_array_equal(seq.tokens[10:14], [9, 9, 9, 9])  # noisy inputs are left as they are
    pairs = {int(i): int(seq.ar_target[i]) for i in np.flatnonzero(seq.ar_weight)}
    assert pairs == {0: 11, 1: 20, 6: 21, 7: 22, 8: 23, 9: 30, 14: EOS}  # up to and including EOS
    # block 1 diverges at 0: offsets 0..3 predict response 5..8; only 0 (predicting EOS itself) is kept.
    np.testing.assert_array_equal(seq.cons_student, [10])
    np.testing.assert_array_equal(seq.cons_teacher, [14])
    np.testing.assert_allclose(seq.cons_weight, [0.5])


def test_pad_equal_to_eos_keeps_the_eos_target():
    clean = np.array([[20, 2, 5, 5]], np.int32)
    seq = pack_example(Example(np.array([10], np.int32), clean.copy(), clean), eos_id=2, pad_id=2)
    assert {int(i): int(seq.ar_target[i]) for i in np.flatnonzero(seq.ar_weight)} == {0: 20, 5: 2}


def test_ar_layout_is_the_clean_stream():
    ex = _example(4, 3, 4, seed=3)
    packed, plain = (f(ex, eos_id=None, pad_id=0) for f in (pack_example, pack_ar_example))
    np.testing.assert_array_equal(plain.tokens, np.concatenate([ex.prompt, ex.clean.reshape(-1)]))
    np.testing.assert_array_equal(plain.position, np.arange(4 + 12))
    np.testing.assert_array_equal(plain.ar_target[plain.ar_weight > 0], packed.ar_target[packed.ar_weight > 0])


def test_buckets_rows_and_stream_determinism():
    assert bucket_for(10, [16, 8, 32]) == 16 and bucket_for(40, [16, 32]) is None
    assert assign_rows([5, 4, 3, 2], 8) == [[0, 2], [1, 3]]
    seqs = [pack_example(_example(int(p), 2, 4, seed=i), eos_id=None, pad_id=0)
            for i, p in enumerate([2, 3, 9, 20, 40])]  # 40 + 16 tokens exceed the largest bucket
    stream = BatchStream(seqs, batch_size=2, buckets=[24, 40], pad_id=0, seed=3)
    assert stream.num_dropped == 1
    shapes = {stream.batch(s)["tokens"].shape for s in range(6)}
    assert shapes <= {(2, 24), (2, 40)} and len(shapes) == 2
    again = BatchStream(seqs, batch_size=2, buckets=[24, 40], pad_id=0, seed=3)
    for s in (5, 0, 3):  # any access order gives the same batch for a step
        for k, v in stream.batch(s).items():
            np.testing.assert_array_equal(again.batch(s)[k], v)
    # every sequence appears exactly once per epoch
    epoch_tokens = sorted(int(t) for s in range(len(stream.plan(0)))
                          for t in stream.batch(s)["ar_weight"].sum(axis=1))
    assert epoch_tokens == sorted([int(s.ar_weight.sum()) for s in seqs[:4]] + [0] * (2 * len(stream.plan(0)) - 4))
