"""``model.cached_attention``: the same numbers as the reference attention over cache ++ block, and the same *bits*
for a query however its forward is shaped (block size, split of the block, rows sharing the cache, batch).

The bitwise checks run on a model of SmolLM2-135M's layer shapes, compiled as decoders compile them
(``decode_jit``): with XLA:CPU's defaults large reductions go to YNNPACK and the bits differ (checked below).
"""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cpu_kernels import bf16_gemm
from jf_jax.model.cached_attention import CHUNK, cached_attention, part_a_sizes
from jf_jax.model.config import ModelConfig
from jf_jax.model.decode_jit import YNN_OPTION, decode_jit
from jf_jax.model.decode_view import decode_view
from jf_jax.model.kv_cache import KVCache
from jf_jax.model.params import cast_params, init_params
from jf_jax.model.token_meta import cache_key_meta, causal_meta, concat_meta
from jf_jax.model.transformer import forward, forward_shared_prefix, logits
from pallas_kernels import attention_reference
from tests.support import kernel_gate


def test_part_a_programs_cover_every_length():
    assert part_a_sizes(400, 64) == (0, 1, 2, 4, 6)
    assert part_a_sizes(63, 64) == (0,)
    assert part_a_sizes(512, 64) == (0, 1, 2, 4, 8)


def _reference(q, k_new, v_new, valid, cache_k, cache_v, lengths):
    B, T = q.shape[:2]
    S = cache_k.shape[1]
    group = B // cache_k.shape[0]  # query rows per cache row
    cache_k, cache_v, lengths = (jnp.repeat(c, group, axis=0) for c in (cache_k, cache_v, lengths))
    q_meta = causal_meta(lengths[:, None] + jnp.arange(T), valid=valid)
    k_meta = concat_meta(cache_key_meta(lengths, S), q_meta)
    return attention_reference(q, jnp.concatenate([cache_k, k_new], 1), jnp.concatenate([cache_v, v_new], 1),
                               q_meta, k_meta)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(rows=st.integers(1, 3), group=st.sampled_from([1, 2, 3, "all"]), T=st.sampled_from([1, 2, 5, 16, 70]),
       capacity=st.sampled_from([80, 200]), data=st.data())
def test_matches_reference_attention(rows, group, T, capacity, data):
    """``group`` query rows per cache row (candidate rows of a prompt), or "all" rows on one cache row."""
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    H, K, Dh = 4, 2, 8
    Bc = 1 if group == "all" else rows
    rows = rows if group == "all" else rows * group
    lengths = np.asarray([data.draw(st.integers(0, capacity)) for _ in range(Bc)], np.int32)
    valid = np.ones((rows, T), bool)
    valid[:, data.draw(st.integers(1, T)):] = False  # trailing padding, as drafts have
    q, k_new, v_new = (jnp.asarray(rng.standard_normal((rows, T, h, Dh)), jnp.float32) for h in (H, K, K))
    cache_k, cache_v = (jnp.asarray(rng.standard_normal((Bc, capacity, K, Dh)), jnp.float32) for _ in range(2))
    got = jax.jit(functools.partial(cached_attention, use_kernel=False))(q, k_new, v_new, valid, cache_k, cache_v,
                                                                        lengths)
    want = _reference(q, k_new, v_new, valid, cache_k, cache_v, lengths)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], rtol=2e-5, atol=2e-5)


def test_rejects_a_cache_with_the_wrong_number_of_rows():
    q = jnp.zeros((3, 2, 4, 8))
    with pytest.raises(ValueError, match="cache has 2 rows for 3 query rows"):
        cached_attention(q, q[:, :, :2], q[:, :, :2], jnp.ones((3, 2), bool), jnp.zeros((2, 8, 2, 8)),
                         jnp.zeros((2, 8, 2, 8)), jnp.zeros((2,), jnp.int32))


# SmolLM2-135M's layer shapes (2 layers, a small vocabulary): big enough for XLA:CPU's size-dependent choices.
MID = ModelConfig(architecture="llama", vocab_size=512, hidden_size=576, intermediate_size=1536, num_layers=2,
                  num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                  max_position_embeddings=2048, attention_bias=False, tie_word_embeddings=True)


def _rms_norm_then_dot(x, w):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-5)
    return jnp.einsum("td,dn->tn", x32.astype(x.dtype), w, preferred_element_type=jnp.float32)


def _ynnpack_reductions(compiled_hlo: str) -> int:
    """Reductions that XLA:CPU handed to YNNPACK (an __ynn_fusion whose result is 1-D: not a dot's)."""
    return sum(1 for line in compiled_hlo.splitlines() if "__ynn_fusion" in line and "f32[16]{0} fusion" in line)


def test_decode_programs_keep_reductions_out_of_ynnpack_whatever_the_environment():
    """``decode_jit`` sets the option per program: it holds without XLA_FLAGS and after JAX has started (this
    process's backend is running). Plain ``jax.jit`` of the same function shows the default it works against."""
    assert YNN_OPTION not in os.environ.get("XLA_FLAGS", "")
    jax.devices()
    x, w = jnp.ones((16, 576), jnp.bfloat16), jnp.ones((576, 1536), jnp.bfloat16)
    assert _ynnpack_reductions(decode_jit(_rms_norm_then_dot).program().lower(x, w).compile().as_text()) == 0
    assert _ynnpack_reductions(jax.jit(_rms_norm_then_dot).lower(x, w).compile().as_text()) == 1


@pytest.mark.parametrize("dtype,layout,kernels", [
    *((dtype, layout, kernels) for dtype, layout in (("float32", "shards"), ("bfloat16", "shards"),
                                                     ("bfloat16", "packed"), ("bfloat16", "int8"))
      for kernels in ("plain-jax", "avx512")),
    # the engine of an AVX2-only CPU: its GEMM and attention kernels (float32: XLA's dots and its attention kernel)
    ("bfloat16", "packed", "avx2"), ("float32", "shards", "avx2"),
])
def test_a_token_gets_the_same_bits_however_its_forward_is_shaped(dtype, layout, kernels, monkeypatch):
    if kernels != "plain-jax":  # skips on a CPU without the set, fails if it is not built
        kernel_gate.apply(kernel_gate.this_machine(kernels))
    # plain-jax: the twins (attention; XLA's dot for packed weights) must be invariant too
    kernel_gate.use_only(monkeypatch, *{"plain-jax": (), "avx512": ("avx512", "avx2"), "avx2": ("avx2",)}[kernels])
    gemm = {"plain-jax": None, "avx512": "jf_bf16_gemm", "avx2": "jf_bf16_gemm_avx2"}[kernels]
    assert bf16_gemm.kernel_target() == gemm  # the GEMM this case is about is the one its programs call
    cfg = MID.replace(dtype=dtype)
    params = cast_params(init_params(cfg, jax.random.PRNGKey(0)), cfg.compute_dtype)
    params = decode_view(params, **{"shards": dict(column_shards=2), "packed": dict(pack=True),
                                    "int8": dict(int8=True)}[layout])
    rng = np.random.default_rng(1)
    P, N = CHUNK - 4, 16  # the block crosses a chunk boundary
    prompt = rng.integers(0, cfg.vocab_size, (1, P)).astype(np.int32)
    cont = rng.integers(0, cfg.vocab_size, (1, N)).astype(np.int32)

    # Programs traced here (after the monkeypatch above), with the weights as arguments, as in the decoders'
    # programs: closed over, they would be constants of each program, compiled and cached with it.
    @decode_jit
    def block_logits_of(params, tokens, cache):
        hidden, cache = forward(params, cfg, tokens, cache=cache)
        return logits(params, cfg, hidden), cache

    shared_prefix = functools.partial(decode_jit(lambda p, t, c: forward_shared_prefix(p, cfg, t, c)), params)
    row_logits = functools.partial(decode_jit(lambda p, h: logits(p, cfg, h)), params)
    block_logits = functools.partial(block_logits_of, params)

    _, cache0 = block_logits(prompt, KVCache.init(cfg, 1, 256))
    cache0 = cache0.commit(P)

    steps, cache = [], cache0  # one token per forward, as AR decodes
    for i in range(N):
        out, cache = block_logits(cont[:, i:i + 1], cache)
        steps.append(np.asarray(out[0, 0]))
        cache = cache.commit(1)
    steps = np.stack(steps)

    whole, _ = block_logits(cont, cache0)
    np.testing.assert_array_equal(np.asarray(whole[0]), steps)

    first, cache = block_logits(cont[:, :5], cache0)  # a block split 5 + 11, as partial acceptance does
    rest, _ = block_logits(cont[:, 5:], cache.commit(5))
    np.testing.assert_array_equal(np.concatenate([first[0], rest[0]]), steps)

    other = rng.integers(0, cfg.vocab_size, (2, N)).astype(np.int32)  # recycled candidate rows beside the draft
    hidden = shared_prefix(np.concatenate([other[:1], cont, other[1:]]), cache0)[0]
    np.testing.assert_array_equal(np.asarray(row_logits(hidden[1])), steps)

    # A batch of two prompts of different lengths (another prompt's cache row beside this one's): the block as
    # one row of a batched forward, and as one of two candidate rows per prompt.
    _, cache1 = block_logits(rng.integers(0, cfg.vocab_size, (1, 2 * CHUNK + 9)).astype(np.int32),
                             KVCache.init(cfg, 1, 256))
    both = KVCache(k=jnp.concatenate([cache0.k, cache1.k], axis=1), v=jnp.concatenate([cache0.v, cache1.v], axis=1),
                   lengths=jnp.asarray([P, 2 * CHUNK + 9], jnp.int32))
    batched, _ = block_logits(np.concatenate([cont, other[:1]]), both)
    np.testing.assert_array_equal(np.asarray(batched[0]), steps)
    hidden = shared_prefix(np.concatenate([other[:1], cont, other]), both)[0]
    np.testing.assert_array_equal(np.asarray(row_logits(hidden[1])), steps)


def _while_body(compiled_hlo: str) -> list[str]:
    """The instruction lines of the (one) while loop's body computation in a compiled program's text."""
    (name,) = set(re.findall(r"body=%([\w.\-]+)", compiled_hlo))
    lines = compiled_hlo.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"%{name} "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("}"))
    return lines[start + 1:end]


def _greedy_loop_text(params, cfg, cache, rows: int = 1) -> str:
    """The compiled text of a greedy decode loop over ``cache`` (every layer's attention feeds the next tokens).
    One row: AR's ``forward``; more: candidate rows over one cache row, the first one's keys written, as mr does."""
    @decode_jit
    def greedy_steps(params, cache, stop):
        def step(state):
            tokens, c = state
            if rows == 1:
                hidden, c = forward(params, cfg, tokens, cache=c)
            else:
                hidden, k, v, c = forward_shared_prefix(params, cfg, tokens, c)
                c = c.write(k[:, :1], v[:, :1])
            return jnp.argmax(logits(params, cfg, hidden), axis=-1).astype(jnp.int32), c.commit(1)

        return jax.lax.while_loop(lambda s: s[1].lengths[0] < stop, step, (jnp.zeros((rows, 1), jnp.int32), cache))

    return greedy_steps.program().lower(params, cache, jnp.int32(cache.lengths[0] + 4)).compile().as_text()


@pytest.mark.parametrize("rows", [1, 3])
def test_a_decode_loop_reads_and_writes_the_cache_where_it_lies(rows):
    """With a CPU kernel, a decode loop's step neither copies each layer's cache into a buffer of its own for the
    kernel nor copies the whole cache before writing the step's keys: at long contexts each was a whole cache's
    worth of memory traffic per step, more than the attention itself (``layer_attention``). One row: AR's
    ``forward``; three: candidate rows over one cache row, the first one's keys written, as mr does."""
    kernel_gate.apply(kernel_gate.this_machine("avx2"))  # the set with the attention and cache-write kernels
    cfg = MID.replace(dtype="bfloat16")
    params = decode_view(cast_params(init_params(cfg, jax.random.PRNGKey(0)), cfg.compute_dtype), pack=True)
    cache = KVCache.init(cfg, 1, 256).with_lengths(40)
    text = _greedy_loop_text(params, cfg, cache, rows)
    body = _while_body(text)
    whole, layer = (f"= bf16[{','.join(map(str, s))}]" for s in (cache.k.shape, cache.k.shape[1:]))
    plumbing = re.compile(r"\s(get-tuple-element|tuple|bitcast|parameter)\(")
    made = [line for line in body if whole in line and not plumbing.search(line)]
    assert len(made) == 2, "expected only the keys' and the values' writes to make a whole cache:\n" + "\n".join(made)
    assert not [line for line in body if layer in line], "a layer's cache is copied out for the kernel"
    # The writes copy the new slots only (``cpu_kernels.write_cache``): XLA:CPU would compute a bf16
    # dynamic-update-slice over a float32 image of the whole cache, a pass over all of it at every step.
    assert f"f32[{','.join(map(str, cache.k.shape))}]" not in text, "a write converts the whole cache"


def test_a_decode_forward_computes_its_rotary_tables_once():
    """The decode layout's unrolled layers read the rotary tables of one forward, computed once: XLA:CPU would
    otherwise fuse cosine and sine into each layer's rotation of q and of k and recompute them for every head and
    lane (``rope_tables(unfused=True)``), a cost that grows with the tokens of a block."""
    cfg = MID.replace(dtype="bfloat16")
    params = decode_view(cast_params(init_params(cfg, jax.random.PRNGKey(0)), cfg.compute_dtype), pack=True)
    cache = KVCache.init(cfg, 1, 64).with_lengths(40)
    block = decode_jit(lambda p, t, c: logits(p, cfg, forward(p, cfg, t, cache=c)[0]))
    text = block.program().lower(params, jnp.zeros((1, 8), jnp.int32), cache).compile().as_text()
    assert cfg.num_layers > 1
    assert (len(re.findall(r"\scosine\(", text)), len(re.findall(r"\ssine\(", text))) == (1, 1)


@pytest.mark.parametrize("pack", [True, False])
def test_a_decode_loop_makes_no_float32_copy_of_the_embedding(pack):
    """The decode view holds a bf16 embedding as its bits (``DecodeView.embed_dtype``): a loop that looks up its
    tokens' rows never converts the whole table to float32 (XLA:CPU's float normalization of a bf16 gather, which
    the loop would hoist and pay at every call). Packed: the GEMM kernels' layout; unpacked: XLA's dots."""
    cfg = MID.replace(dtype="bfloat16")
    params = decode_view(cast_params(init_params(cfg, jax.random.PRNGKey(0)), cfg.compute_dtype), pack=pack)
    assert params.embed_dtype == "bfloat16"
    text = _greedy_loop_text(params, cfg, KVCache.init(cfg, 1, 64).with_lengths(40))
    assert f"f32[{cfg.vocab_size},{cfg.hidden_size}]" not in text
