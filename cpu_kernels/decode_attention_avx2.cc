// The decode-step attention of decode_attention.cc for CPUs with AVX2 and FMA only, as an XLA FFI custom call.
//
// Semantics: those of decode_attention.cc and jf_jax.model.cached_attention (row b's token t sits at position
// lengths[b] + t; cache row b // (B / Bc) serves query row b; key j is cache[j] for j < length and the row's own
// new key j - length after that, if valid; a query sees keys j <= its position; output float32).
//
// Why a kernel: on a CPU without the AVX-512 set, the plain-JAX twin is ~40 small XLA operations per layer whose
// fixed costs outweigh the arithmetic; on a 2-core AVX2 CPU it was about a third of a one-token step.
//
// Batch invariance by construction, as in the AVX-512 kernel: a query's result is a fixed sequence of float
// operations over its keys in blocks of 8 aligned to absolute positions (scores as one FMA chain over the head
// dimension per key, online-softmax rescale, probabilities, value sums in key order), and that sequence depends
// only on the query's position and the keys' bits: not on how many tokens, rows, or threads share the call. Its
// blocks are half as wide as the AVX-512 kernel's, so the two agree to rounding, not bit for bit; a process runs
// one of them for every decoder.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common.h"
#include "decode_attention_call.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kBlock = 8;         // keys per block (one AVX2 register of scores)
constexpr int kRowsPerItem = 8;   // query tokens per work item (each item converts its keys once)
constexpr int kScoreRows = 8;     // query rows whose scores share each key load (eight independent FMA chains)

inline __m256 Load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }

// exp of 8 lanes (arguments <= 0 here): 2^n * p(r), r = x - n ln2, |r| <= ln2/2, degree-6 polynomial; 2^n is
// built in the exponent field (n >= -126 after the clamp, so it is a normal number).
inline __m256 Exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.3888889e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3333333e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1666667e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666667e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// Transposes the 8x8 float32 matrix whose rows are r[0..7] (r[i] becomes column i).
inline void Transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// kt[d * 8 + j] = key j's element d (float32), for the 8 keys of a block (nullptr: a zero key); Dh % 8 == 0.
template <typename E>
inline void TransposeKeys(const E* const keys[kBlock], int64_t Dh, float* kt) {
  for (int64_t d0 = 0; d0 < Dh; d0 += 8) {
    __m256 r[kBlock];
    for (int j = 0; j < kBlock; ++j) r[j] = keys[j] ? Load8(keys[j] + d0) : _mm256_setzero_ps();
    Transpose8(r);
    for (int i = 0; i < kBlock; ++i) _mm256_storeu_ps(kt + (d0 + i) * kBlock, r[i]);
  }
}

// scores[r * 8 + j] = scale * q_r . key_j for the rows ``rows[0..nr)`` (one FMA chain over d per row, in order).
inline void ScoreRows(const float* q, const int64_t* rows, int nr, const float* kt, int64_t Dh, float scale,
                      float* scores) {
  __m256 s[kScoreRows];
  const float* qr[kScoreRows];
  for (int r = 0; r < kScoreRows; ++r) {
    s[r] = _mm256_setzero_ps();
    qr[r] = q + rows[r < nr ? r : 0] * Dh;
  }
  for (int64_t d = 0; d < Dh; ++d) {
    const __m256 kv = _mm256_loadu_ps(kt + d * kBlock);
    for (int r = 0; r < kScoreRows; ++r) s[r] = _mm256_fmadd_ps(_mm256_set1_ps(qr[r][d]), kv, s[r]);
  }
  for (int r = 0; r < nr; ++r) _mm256_storeu_ps(scores + r * kBlock, _mm256_mul_ps(s[r], _mm256_set1_ps(scale)));
}

// The online-softmax step of a block for up to 8 rows at once, one row per lane: for row i < nr (scores s[i * 8 +
// j], keys j with bit j of mask[i] visible), the block's max m' = max(m, max_j s_j), alpha_i = exp(m - m') (0 when
// m is -inf), p_j = exp(s_j - m') for visible j and 0 otherwise (written over s), l = l * alpha + (p_0 + ... + p_7)
// summed in key order, m = m'. Every lane's arithmetic is its row's alone.
inline void SoftmaxRows(float* s, const int64_t* rows, const uint32_t* mask, int nr, float* m, float* l,
                        float* alpha_out) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  alignas(32) float m_old[kScoreRows], l_old[kScoreRows];
  alignas(32) int32_t bits[kScoreRows];
  for (int i = 0; i < kScoreRows; ++i) {
    m_old[i] = i < nr ? m[rows[i]] : 0.0f;
    l_old[i] = i < nr ? l[rows[i]] : 0.0f;
    bits[i] = i < nr ? int32_t(mask[i]) : 0;
  }
  __m256 k[kBlock];  // k[j]: key j's scores, one row per lane
  for (int i = 0; i < kBlock; ++i) k[i] = _mm256_loadu_ps(s + i * kBlock);
  Transpose8(k);
  const __m256i lane_bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(bits));
  __m256 visible[kBlock];
  __m256 block_max = _mm256_set1_ps(neg_inf);
  for (int j = 0; j < kBlock; ++j) {
    const __m256i bit = _mm256_set1_epi32(1 << j);
    visible[j] = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(lane_bits, bit), bit));
    block_max = _mm256_max_ps(block_max, _mm256_blendv_ps(_mm256_set1_ps(neg_inf), k[j], visible[j]));
  }
  const __m256 mo = _mm256_load_ps(m_old);
  const __m256 m_new = _mm256_max_ps(mo, block_max);
  const __m256 first = _mm256_cmp_ps(mo, _mm256_set1_ps(neg_inf), _CMP_EQ_OQ);
  const __m256 alpha = _mm256_blendv_ps(Exp8(_mm256_sub_ps(mo, m_new)), _mm256_setzero_ps(), first);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < kBlock; ++j) {
    k[j] = _mm256_and_ps(Exp8(_mm256_sub_ps(k[j], m_new)), visible[j]);
    sum = _mm256_add_ps(sum, k[j]);
  }
  alignas(32) float l_new[kScoreRows], m_out[kScoreRows];
  _mm256_store_ps(l_new, _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(l_old), alpha), sum));
  _mm256_store_ps(m_out, m_new);
  _mm256_store_ps(alpha_out, alpha);
  Transpose8(k);  // back to one row of 8 probabilities per register
  for (int i = 0; i < nr; ++i) {
    _mm256_storeu_ps(s + i * kBlock, k[i]);
    l[rows[i]] = l_new[i];
    m[rows[i]] = m_out[i];
  }
}

// acc[d0 : d0 + 64] = alpha * acc + sum over visible keys j (in order) of p[j] * value_j, for one row.
inline void ValueRow(const float* probs, uint32_t mask, float alpha, const float* vt, int64_t Dh, int64_t d0,
                     float* acc) {
  const int lanes = Dh - d0 >= 64 ? 8 : int((Dh - d0) / 8);
  __m256 o[8];
  for (int u = 0; u < lanes; ++u) o[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 8 * u), _mm256_set1_ps(alpha));
  for (int jj = 0; jj < kBlock; ++jj) {
    if (!(mask & (1u << jj))) continue;
    const __m256 pb = _mm256_set1_ps(probs[jj]);
    for (int u = 0; u < lanes; ++u) o[u] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vt + jj * Dh + d0 + 8 * u), o[u]);
  }
  for (int u = 0; u < lanes; ++u) _mm256_storeu_ps(acc + d0 + 8 * u, o[u]);
}

template <typename E>
using Args = jf_cpu::AttentionArgs<E>;

// Queries of tokens [t0, t1) of row b on kv head kh (all G query heads of that kv head).
template <typename E>
void AttendItem(const Args<E>& a, int64_t b, int64_t kh, int64_t t0, int64_t t1) {
  const int64_t G = a.H / a.K, Dh = a.Dh, cb = b / (a.B / a.Bc);
  const int64_t len = a.lengths[cb];
  const int64_t rows = (t1 - t0) * G;
  const float scale = 1.0f / std::sqrt(float(Dh));
  std::vector<float> q(rows * Dh), acc(rows * Dh, 0.0f), m(rows, -std::numeric_limits<float>::infinity()),
      l(rows, 0.0f), kt(Dh * kBlock), vt(kBlock * Dh);
  alignas(32) float scores[kScoreRows * kBlock] = {}, alpha[kScoreRows];
  std::vector<int64_t> act_row(rows);
  std::vector<uint32_t> act_mask(rows);
  a.LoadQueries(b, kh, t0, t1, q.data());
  const int64_t last = a.LastVisible(b, t0, t1, len);
  for (int64_t j0 = 0; j0 <= last; j0 += kBlock) {
    uint32_t key_ok = 0;
    const E* key_rows[kBlock];
    for (int jj = 0; jj < kBlock; ++jj) {
      const int64_t j = j0 + jj;
      const E *ks, *vs;
      a.KeyValue(b, cb, kh, len, j, &ks, &vs);
      if (ks != nullptr) key_ok |= 1u << jj;
      key_rows[jj] = ks;
      for (int64_t d = 0; d < Dh; d += 8)
        _mm256_storeu_ps(&vt[jj * Dh + d], vs ? Load8(vs + d) : _mm256_setzero_ps());
    }
    TransposeKeys(key_rows, Dh, kt.data());
    // The rows that see this block, eight at a time (scores sharing each key load, the softmax bookkeeping with one
    // row per lane, the value sums): rows are independent, so each step overlaps their dependency chains instead of
    // running one row's chain at a time.
    int64_t active = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = len + t;
      if (!a.valid[b * a.T + t] || pos < j0) continue;
      const int64_t seen = pos - j0 + 1;  // keys j0 .. pos are causal
      const uint32_t mask = key_ok & (seen >= kBlock ? 0xFFu : ((1u << seen) - 1u));
      if (mask == 0) continue;
      for (int64_t g = 0; g < G; ++g) {
        act_row[active] = (t - t0) * G + g;
        act_mask[active++] = mask;
      }
    }
    for (int64_t i0 = 0; i0 < active; i0 += kScoreRows) {
      const int nr = active - i0 < kScoreRows ? int(active - i0) : kScoreRows;
      ScoreRows(q.data(), act_row.data() + i0, nr, kt.data(), Dh, scale, scores);
      SoftmaxRows(scores, act_row.data() + i0, act_mask.data() + i0, nr, m.data(), l.data(), alpha);
      for (int i = 0; i < nr; ++i)
        for (int64_t d0 = 0; d0 < Dh; d0 += 64)
          ValueRow(&scores[i * kBlock], act_mask[i0 + i], alpha[i], vt.data(), Dh, d0, &acc[act_row[i0 + i] * Dh]);
    }
  }
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = (t - t0) * G + g;
      float* o = a.out + ((b * a.T + t) * a.H + kh * G + g) * Dh;
      const float inv = l[row] > 0.0f ? 1.0f / l[row] : 0.0f;
      for (int64_t d = 0; d < Dh; ++d) o[d] = acc[row * Dh + d] * inv;
    }
}

template <ffi::DataType DT, typename E>
ffi::Error Attend(JF_ATTENTION_SIGNATURE(DT)) {
  return jf_cpu::RunAttention<DT, E>("decode_attention_avx2", kRowsPerItem, JF_ATTENTION_ARGUMENTS, AttendItem<E>);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfDecodeAttentionAvx2Bf16, (Attend<ffi::BF16, uint16_t>),
                              JF_ATTENTION_BINDING(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JfDecodeAttentionAvx2F32, (Attend<ffi::F32, float>), JF_ATTENTION_BINDING(ffi::F32));
