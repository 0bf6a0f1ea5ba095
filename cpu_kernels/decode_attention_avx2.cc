// The decode-step attention for x86 CPUs with AVX2 and FMA (AVX-512 ones included), as an XLA FFI custom call.
//
// Semantics: those of jf_jax.model.cached_attention (row b's token t sits at position lengths[b] + t; cache row
// b // (B / Bc) serves query row b; key j is cache[j] for j < length and the row's own new key j - length after
// that, if valid; a query sees keys j <= its position; output float32).
//
// Why a kernel: the plain-JAX twin is ~40 small XLA operations per layer whose fixed costs outweigh the arithmetic
// on a CPU; on a 2-core AVX2 CPU it was about a third of a one-token step.
//
// Batch invariance by construction: a query's result is a fixed sequence of float operations over its keys in
// blocks of 8 aligned to absolute positions (a block's 8 scores, each as 8 FMA chains over the head dimension added
// in a fixed tree; the online-softmax rescale; probabilities; value sums in key order), and that sequence depends
// only on the query's position and the keys' bits: not on how many tokens, rows, or threads share the call.
//
// Speed: the cache is read once per kv head and work item, 8 keys at a time, converted to float32 once for all the
// item's rows; the rows then go through each step of a block together (scores, softmax, value sums), so their
// independent dependency chains overlap; the keys and values a few blocks ahead are prefetched.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common.h"
#include "decode_attention_call.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kBlock = 8;        // keys per block (one AVX2 register of scores)
constexpr int kRowsPerItem = 8;  // query tokens per work item (each item converts its keys once)
// How far ahead of the block being read its keys and values are prefetched: a kv head's rows are 128 or 256 bytes
// every K * Dh elements, a stride the hardware prefetchers follow too late, and reading the cache is a long
// context's step.
constexpr int kPrefetchKeys = 16;

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

// Lane i of the result: the sum of a[i]'s lanes as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)).
inline __m256 LaneSums8(const __m256 a[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// The sum of x's lanes as ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)).
inline float Sum8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

inline float Max8(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// Lane j all ones where bit j of ``mask`` is set.
inline __m256 LaneMask(uint32_t mask) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(mask)), bits), bits));
}

// scale * (q . key_j) for the 8 keys of a block (kf: key j's Dh elements at kf + j * Dh) as one vector: for each key
// eight partial sums over the head dimension (lane i sums the elements d = i mod 8, in order, one FMA chain), then
// those eight added by LaneSums8. The eight keys' chains are independent, so they overlap.
inline __m256 BlockScores(const float* q, const float* kf, int64_t Dh, float scale) {
  __m256 part[kBlock];
  const __m256 q0 = _mm256_loadu_ps(q);
  for (int j = 0; j < kBlock; ++j) part[j] = _mm256_mul_ps(q0, _mm256_loadu_ps(kf + j * Dh));
  for (int64_t d = 8; d < Dh; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    for (int j = 0; j < kBlock; ++j) part[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kf + j * Dh + d), part[j]);
  }
  return _mm256_mul_ps(LaneSums8(part), _mm256_set1_ps(scale));
}

// acc[0 : 8U] = alpha * acc + p_0 v_0 + ... + p_7 v_7 (v_j at vf + j * Dh), one FMA chain per 8 dimensions in key
// order; the U chains are independent, so they overlap.
template <int U>
inline void AddValues(const float* p, float alpha, const float* vf, int64_t Dh, float* acc) {
  __m256 o[U];
  const __m256 av = _mm256_set1_ps(alpha);
  for (int u = 0; u < U; ++u) o[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * u), av);
  for (int j = 0; j < kBlock; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int u = 0; u < U; ++u) o[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vf + j * Dh + 8 * u), o[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_storeu_ps(acc + 8 * u, o[u]);
}

// One row's online-softmax step over a block (scores s, keys visible where bit j of ``mask`` is set, at least one):
// m' = max(m, visible scores), alpha = exp(m - m') (exactly 1 when m' == m, 0 when m is -inf), p_j = exp(s_j - m')
// on visible keys and 0 elsewhere (written over s), l = l * alpha + Sum8(p), m = m'. Returns alpha.
inline float SoftmaxStep(float* s, uint32_t mask, float* m, float* l) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m256 visible = LaneMask(mask), sv = _mm256_load_ps(s);
  const float m_new = std::max(*m, Max8(_mm256_blendv_ps(_mm256_set1_ps(neg_inf), sv, visible)));
  const float alpha = *m == m_new    ? 1.0f
                      : *m == neg_inf ? 0.0f
                                      : _mm256_cvtss_f32(Exp8(_mm256_set1_ps(*m - m_new)));
  const __m256 pv = _mm256_and_ps(Exp8(_mm256_sub_ps(sv, _mm256_set1_ps(m_new))), visible);
  _mm256_store_ps(s, pv);
  *l = *l * alpha + Sum8(pv);
  *m = m_new;
  return alpha;
}

template <typename E>
using Args = jf_cpu::AttentionArgs<E>;

// Queries of tokens [t0, t1) of row b on kv head kh (all G query heads of that kv head). Each block's keys and
// values are converted to float32 once and read by every row that sees the block.
template <typename E>
void AttendItem(const Args<E>& a, int64_t b, int64_t kh, int64_t t0, int64_t t1) {
  const int64_t G = a.H / a.K, Dh = a.Dh, cb = b / (a.B / a.Bc);
  const int64_t len = a.lengths[cb];
  const int64_t rows = (t1 - t0) * G;
  const float scale = 1.0f / std::sqrt(float(Dh));
  std::vector<float> q(rows * Dh), acc(rows * Dh, 0.0f), m(rows, -std::numeric_limits<float>::infinity()),
      l(rows, 0.0f), kf(kBlock * Dh), vf(kBlock * Dh), alpha(rows);
  std::vector<int64_t> act_row(rows);
  std::vector<uint32_t> act_mask(rows);
  // probs[i * 8 + j]: active row i's score, then probability, of key j (32-byte aligned rows)
  std::vector<__m256> prob_rows(rows);
  float* probs = reinterpret_cast<float*>(prob_rows.data());
  a.LoadQueries(b, kh, t0, t1, q.data());
  const int64_t last = a.LastVisible(b, t0, t1, len);
  for (int64_t j0 = 0; j0 <= last; j0 += kBlock) {
    uint32_t key_ok = 0;
    for (int jj = 0; jj < kBlock; ++jj) {
      const E *ks, *vs;
      a.KeyValue(b, cb, kh, len, j0 + jj + kPrefetchKeys, &ks, &vs);
      if (ks != nullptr) {
        for (int64_t byte = 0; byte < Dh * int64_t(sizeof(E)); byte += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(ks) + byte, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(vs) + byte, _MM_HINT_T0);
        }
      }
      a.KeyValue(b, cb, kh, len, j0 + jj, &ks, &vs);
      if (ks != nullptr) key_ok |= 1u << jj;
      for (int64_t d = 0; d < Dh; d += 8) {
        _mm256_storeu_ps(&kf[jj * Dh + d], ks ? Load8(ks + d) : _mm256_setzero_ps());
        _mm256_storeu_ps(&vf[jj * Dh + d], vs ? Load8(vs + d) : _mm256_setzero_ps());
      }
    }
    // The rows that see this block, then each step for all of them before the next: the rows' chains of dependent
    // operations (scores, exp, value sums) are independent, so running one step over many rows overlaps them.
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
    for (int64_t i = 0; i < active; ++i)
      _mm256_store_ps(&probs[i * kBlock], BlockScores(&q[act_row[i] * Dh], kf.data(), Dh, scale));
    for (int64_t i = 0; i < active; ++i)
      alpha[i] = SoftmaxStep(&probs[i * kBlock], act_mask[i], &m[act_row[i]], &l[act_row[i]]);
    for (int64_t i = 0; i < active; ++i) {
      float* acc_row = &acc[act_row[i] * Dh];
      int64_t d = 0;
      for (; d + 64 <= Dh; d += 64) AddValues<8>(&probs[i * kBlock], alpha[i], vf.data() + d, Dh, acc_row + d);
      for (; d < Dh; d += 32) AddValues<4>(&probs[i * kBlock], alpha[i], vf.data() + d, Dh, acc_row + d);
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
