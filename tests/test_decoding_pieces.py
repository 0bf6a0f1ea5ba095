"""Unit tests of the pure pieces the block decoders are built from: acceptance capping and stop reasons
(``decoding.blocks``), the rejection-recycling pool (``decoding.recycling``) and the statistics
(``decoding.stats``), each against a plain-Python reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jf_jax.decoding.blocks import block_key, cap_accepted, draw_context, step_stop
from jf_jax.decoding.common import StopReason, prompt_key
from jf_jax.decoding.recycling import build_candidates, harvest, pick_winner, push
from jf_jax.decoding.stats import prompt_stats, summarize, without_timings

EOS = 99
EOS_IDS = jnp.asarray([EOS, -1, -1, -1, -1, -1, -1, -1], jnp.int32)


@pytest.mark.parametrize("draft, accepted, count, max_new, expected", [
    ([3, 4, EOS, 5], 4, 0, 10, (3, True)),  # the EOS is accepted: everything after it is dropped
    ([3, 4, EOS, 5], 4, 0, 2, (2, False)),  # the cap cuts before the EOS: it is not accepted
    ([3, 4, EOS, 5], 4, 7, 10, (3, True)),  # room for exactly the tokens up to the EOS
    ([3, 4, EOS, 5], 2, 0, 10, (2, False)),  # the EOS lies past the verified prefix
    ([3, 4, 6, 5], 4, 5, 7, (2, False)),
])
def test_cap_accepted(draft, accepted, count, max_new, expected):
    got = cap_accepted(jnp.asarray(draft, jnp.int32), jnp.int32(accepted), jnp.int32(count), jnp.int32(max_new),
                       EOS_IDS)
    assert (int(got[0]), bool(got[1])) == expected


def test_drafts_are_drawn_from_the_context_evenly_and_depend_only_on_key_and_block():
    """The integer-hash draws: ids from ``prompt[:prompt_len] ++ out[:count]`` only, every slot reached about equally
    often, the same draft for the same (key, block start), and other drafts for other blocks and prompts."""
    prompt = jnp.arange(100, 110, dtype=jnp.int32)  # 10 slots, 7 of them the prompt
    out = jnp.arange(200, 216, dtype=jnp.int32)
    draw = jax.jit(lambda key, start: draw_context(block_key(key, start), prompt, 7, out, 3, 16))
    key = prompt_key(0, 0)
    drafts = np.stack([np.asarray(draw(key, start)) for start in range(400)])  # 6,400 draws
    context = np.concatenate([np.arange(100, 107), np.arange(200, 203)])
    counts = np.array([(drafts == c).sum() for c in context])
    expected = drafts.size / len(context)
    assert counts.sum() == drafts.size and 0.8 * expected < counts.min() <= counts.max() < 1.2 * expected
    assert (np.asarray(draw(key, 5)) == drafts[5]).all()
    assert len({tuple(d) for d in drafts}) == len(drafts)
    assert not (np.asarray(draw(prompt_key(0, 1), 5)) == drafts[5]).all()


def test_step_stop_names_each_reason():
    def reason(stopped=False, hit_eos=False, extra_eos=False, full=False, count=1, max_new=5):
        return StopReason(int(step_stop(stopped, hit_eos, extra_eos, full, jnp.int32(count), jnp.int32(max_new))))

    assert reason() == StopReason.RUNNING
    assert reason(hit_eos=True) == StopReason.EOS_ACCEPTED
    assert reason(extra_eos=True) == StopReason.EOS_CORRECTION
    assert reason(extra_eos=True, full=True) == StopReason.EOS_BONUS
    assert reason(count=5) == StopReason.MAX_NEW_TOKENS
    assert reason(stopped=True, hit_eos=True) == StopReason.RUNNING  # stopped earlier: nothing is added
    assert StopReason.EOS_FIRST.label == "eos_first"


# ---------------------------------------------------------------------------------------------------------
# The recycling pool against a plain-Python reference.

def ref_candidates(pool, pool_len, pool_next, row, ra_len, num):
    """Newest entry first; an entry holding row[0] gives the row with its first ra_len tokens taken from the entry
    from that token's first occurrence on (as far as the entry goes); candidates equal to the row are dropped."""
    S = len(pool)
    cands = []
    for k in range(S):
        e = (pool_next - 1 - k) % S
        entry = list(pool[e][: pool_len[e]])
        if row[0] not in entry:
            continue
        start = entry.index(row[0])
        cand = list(row)
        for i in range(ra_len):
            if start + i < len(entry):
                cand[i] = entry[start + i]
        if cand != list(row):
            cands.append(cand)
    cands = cands[:num]
    return cands + [list(row)] * (num - len(cands)), [True] * len(cands) + [False] * (num - len(cands))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data(), S=st.integers(1, 4), W=st.integers(2, 6), num=st.integers(1, 3))
def test_build_candidates_matches_the_reference(data, S, W, num):
    Lp = W + 3
    tokens = st.integers(0, 4)  # a small alphabet, so entries often hold row[0]
    pool = np.asarray(data.draw(st.lists(st.lists(tokens, min_size=Lp, max_size=Lp), min_size=S, max_size=S)))
    pool_len = np.asarray(data.draw(st.lists(st.integers(0, Lp), min_size=S, max_size=S)))
    pool_next = data.draw(st.integers(0, S - 1))
    row = np.asarray(data.draw(st.lists(tokens, min_size=W, max_size=W)))
    ra_len = data.draw(st.integers(1, W))
    rows, found = build_candidates(jnp.asarray(pool, jnp.int32), jnp.asarray(pool_len, jnp.int32),
                                   jnp.int32(pool_next), jnp.asarray(row, jnp.int32), jnp.int32(ra_len), num)
    want_rows, want_found = ref_candidates(pool.tolist(), pool_len.tolist(), pool_next, row.tolist(), ra_len, num)
    assert np.asarray(rows).tolist() == want_rows
    assert np.asarray(found).tolist() == want_found


def test_push_is_a_ring_and_skips_short_or_disabled_entries():
    pool, lens, nxt = jnp.zeros((2, 4), jnp.int32), jnp.zeros((2,), jnp.int32), jnp.int32(0)
    entry = lambda v: jnp.full((4,), v, jnp.int32)  # noqa: E731
    pool, lens, nxt = push(pool, lens, nxt, entry(1), jnp.int32(3), jnp.bool_(True))
    pool, lens, nxt = push(pool, lens, nxt, entry(2), jnp.int32(1), jnp.bool_(True))  # too short: one token
    pool, lens, nxt = push(pool, lens, nxt, entry(3), jnp.int32(4), jnp.bool_(False))  # disabled
    assert np.asarray(lens).tolist() == [3, 0] and int(nxt) == 1
    pool, lens, nxt = push(pool, lens, nxt, entry(4), jnp.int32(2), jnp.bool_(True))
    pool, lens, nxt = push(pool, lens, nxt, entry(5), jnp.int32(4), jnp.bool_(True))  # overwrites the oldest
    assert np.asarray(pool)[:, 0].tolist() == [5, 4] and np.asarray(lens).tolist() == [4, 2] and int(nxt) == 1


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data(), n=st.integers(1, 4), W=st.integers(2, 8), ctx_len=st.integers(1, 12))
def test_harvest_matches_the_reference(data, n, W, ctx_len):
    context = np.arange(100, 100 + ctx_len)
    d = np.arange(200, 200 + W)
    g = np.arange(300, 300 + W)
    row_len = data.draw(st.integers(1, W))
    accepted = data.draw(st.integers(1, row_len))
    Lp = n + W
    (first, first_len), (tail, tail_len) = harvest(
        lambda idx: jnp.asarray(context)[jnp.clip(idx, 0, ctx_len - 1)], jnp.int32(ctx_len), jnp.asarray(d),
        jnp.asarray(g), jnp.int32(accepted), jnp.int32(row_len), n, Lp)
    m = min(n, ctx_len)
    want_first = context[ctx_len - m:].tolist() + d[accepted:row_len].tolist()  # recent context ++ rejected row
    want_tail = g[accepted: row_len - 1].tolist()  # the model's greedy tail after the correction token
    assert int(first_len) == len(want_first) and np.asarray(first)[: len(want_first)].tolist() == want_first
    assert int(tail_len) == len(want_tail) and np.asarray(tail)[: len(want_tail)].tolist() == want_tail


def test_pick_winner_prefers_more_accepted_tokens_and_the_plain_draft_on_ties():
    preds = jnp.asarray([[1, 2, 3, 4]] * 3, jnp.int32)
    rows = jnp.asarray([[0, 1, 9, 9], [0, 1, 2, 9], [0, 1, 2, 9]], jnp.int32)  # rows 1 and 2 verify 3 tokens
    assert int(pick_winner(rows, preds, jnp.int32(4), jnp.int32(4))) == 1  # the first of the best rows
    assert int(pick_winner(rows, preds, jnp.int32(4), jnp.int32(2))) == 0  # capped at the RA: all tie -> row 0


# ---------------------------------------------------------------------------------------------------------
# Statistics.

def test_prompt_stats_and_summary():
    a = prompt_stats(tokens=10, forwards=5, stop=StopReason.EOS_BONUS, seconds=2.0, prefill_seconds=0.5,
                     block_iters=np.asarray([3, 1, 0, 0]), accept_hist=np.asarray([0, 2, 1, 1]),
                     counters={"recycling_rounds": 2})
    b = prompt_stats(tokens=2, forwards=2, stop=StopReason.MAX_NEW_TOKENS, seconds=1.0, prefill_seconds=0.5,
                     block_iters=np.asarray([1, 0]), accept_hist=np.asarray([0, 1]), counters={"recycling_rounds": 0})
    assert a["stop_reason"] == "eos_bonus" and a["tpf"] == 2.0
    assert a["iterations_per_block"] == [3, 1] and a["blocks"] == 2 and a["max_accepted_per_iteration"] == 3
    assert a["tokens_per_second"] == 5.0 and a["tokens_per_second_excl_prefill"] == 10 / 1.5
    total = summarize([a, b])
    assert total["tokens"] == 12 and total["forwards"] == 7 and total["tpf"] == 12 / 7
    assert total["mean_tpf"] == (2.0 + 1.0) / 2
    assert total["tokens_per_second"] == 12 / 3.0 and total["tokens_per_second_excl_prefill"] == 12 / 2.0
    assert total["blocks"] == 3 and total["mean_iterations_per_block"] == 5 / 3
    assert total["accepted_per_iteration_histogram"] == [0, 3, 1, 1] and total["recycling_rounds"] == 2
    assert "seconds" not in without_timings(total) and without_timings(total)["tokens"] == 12
    batched = summarize([prompt_stats(tokens=4, forwards=4, stop=StopReason.EOS)], seconds=2.0, prefill_seconds=1.0)
    assert batched["tokens_per_second"] == 2.0 and batched["tokens_per_second_excl_prefill"] == 4.0
    with pytest.raises(ValueError):
        summarize([])


def test_greedy_is_argmax_with_ties_to_the_lowest_id():
    from jf_jax.decoding.common import greedy

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 300)).astype(np.float32)
    logits[1, [7, 40, 299]] = 10.0  # a three-way tie
    logits[2, :] = 0.0  # all tied
    np.testing.assert_array_equal(np.asarray(greedy(logits)), np.argmax(logits, axis=-1))
    assert int(greedy(logits)[1]) == 7 and int(greedy(logits)[2]) == 0
