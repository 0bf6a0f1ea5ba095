// Attention of a decode step's new tokens over a KV cache and each other, as an XLA FFI custom call.
//
// Semantics (those of jf_jax.model.cached_attention): row b's token t sits at position lengths[b] + t (cache
// row b // (B / Bc) serves query row b: one cache row may be shared by several query rows); key j of row b is cache[j] for j < length and the
// row's own new key j - length after that (if valid); a query sees keys j <= its position. Output float32.
//
// Why a kernel: the same computation in XLA is ~40 small ops per layer (transposes, masks, reductions,
// switches), whose per-op overhead costs more than the arithmetic on a 2-core CPU.
//
// Batch invariance by construction: a query's result is a fixed sequence of float operations over its keys
// in blocks of 16 aligned to absolute positions (scores, online-softmax rescale, probabilities, value sums in
// key order), and that sequence depends only on the query's position and the keys' bits: not on how many
// tokens, rows, or threads share the call. A 16-token Jacobi block and a one-token AR step therefore give a
// token the same bits.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common.h"
#include "decode_attention_call.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kBlock = 16;     // keys per block (one AVX512 register of scores)
constexpr int kRowsPerItem = 8;   // query tokens per work item (each item converts its keys once)

inline __m512 Load16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }

// exp of 16 lanes (arguments <= 0 here): 2^n * p(r), r = x - n ln2, |r| <= ln2/2, degree-6 polynomial.
inline __m512 Exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.3888889e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333333e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1666667e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666667e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline float ExpScalar(float x) {
  if (x == -std::numeric_limits<float>::infinity()) return 0.0f;
  return _mm512_cvtss_f32(Exp16(_mm512_set1_ps(x)));
}

// Transposes a 16x16 matrix of 32-bit elements held as 16 rows (r[i] = row i) into its 16 columns.
inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + k]: column 4L + k of rows 4g..4g+3 in 128-bit lane L
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i p0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), q0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
    const __m512i p1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    const __m512i q1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_i32x4(p0, p1, 0x88);       // column k      (lane 0)
    r[8 + k] = _mm512_shuffle_i32x4(p0, p1, 0xDD);   // column 8 + k  (lane 2)
    r[4 + k] = _mm512_shuffle_i32x4(q0, q1, 0x88);   // column 4 + k  (lane 1)
    r[12 + k] = _mm512_shuffle_i32x4(q0, q1, 0xDD);  // column 12 + k (lane 3)
  }
}

// kt[d * 16 + j] = key j's element d (float32), for the 16 keys of a block (nullptr: a zero key).
inline void TransposeKeys(const uint16_t* const keys[kBlock], int64_t Dh, float* kt) {
  for (int64_t c0 = 0; c0 < Dh / 2; c0 += 16) {  // 16 dwords = 32 bf16 dims at a time
    __m512i r[16];
    for (int j = 0; j < kBlock; ++j)
      r[j] = keys[j] ? _mm512_loadu_si512(keys[j] + 2 * c0) : _mm512_setzero_si512();
    Transpose16x16(r);
    for (int c = 0; c < 16; ++c) {  // dword c holds dims 2c (low half) and 2c + 1 (high half)
      const int64_t d = 2 * (c0 + c);
      _mm512_storeu_si512(kt + d * kBlock, _mm512_slli_epi32(r[c], 16));
      _mm512_storeu_si512(kt + (d + 1) * kBlock, _mm512_and_si512(r[c], _mm512_set1_epi32(int32_t(0xFFFF0000u))));
    }
  }
}
inline void TransposeKeys(const float* const keys[kBlock], int64_t Dh, float* kt) {
  for (int64_t c0 = 0; c0 < Dh; c0 += 16) {
    __m512i r[16];
    for (int j = 0; j < kBlock; ++j) r[j] = keys[j] ? _mm512_loadu_si512(keys[j] + c0) : _mm512_setzero_si512();
    Transpose16x16(r);
    for (int c = 0; c < 16; ++c) _mm512_storeu_si512(kt + (c0 + c) * kBlock, r[c]);
  }
}

constexpr int kScoreRows = 4;  // query rows whose scores share each key load (four independent FMA chains)
constexpr int kValueRows = 2;  // query rows whose value sums share each value load

// scores[r * 16 + j] = scale * q_r . key_j for the rows ``rows[0..nr)`` (one FMA chain over d per row, in order).
inline void ScoreRows(const float* q, const int64_t* rows, int nr, const float* kt, int64_t Dh, float scale,
                      float* scores) {
  __m512 s[kScoreRows];
  const float* qr[kScoreRows];
  for (int r = 0; r < kScoreRows; ++r) {
    s[r] = _mm512_setzero_ps();
    qr[r] = q + rows[r < nr ? r : 0] * Dh;
  }
  for (int64_t d = 0; d < Dh; ++d) {
    const __m512 kv = _mm512_loadu_ps(kt + d * kBlock);
    for (int r = 0; r < kScoreRows; ++r) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[r][d]), kv, s[r]);
  }
  for (int r = 0; r < nr; ++r) _mm512_storeu_ps(scores + r * kBlock, _mm512_mul_ps(s[r], _mm512_set1_ps(scale)));
}

// acc_r[d0 : d0 + 64] = alpha_r * acc_r + sum over visible keys j (in order) of p_r[j] * value_j, for up to
// kValueRows rows at once (a row's own sequence of operations does not depend on its neighbours).
inline void ValueRows(const float* probs, const __mmask16* masks, const int64_t* rows, const float* alphas, int nr,
                      const float* vt, int64_t Dh, int64_t d0, float* acc) {
  const int lanes = Dh - d0 >= 64 ? 4 : int((Dh - d0) / 16);
  __m512 o[kValueRows][4];
  for (int r = 0; r < nr; ++r)
    for (int u = 0; u < lanes; ++u)
      o[r][u] = _mm512_mul_ps(_mm512_loadu_ps(acc + rows[r] * Dh + d0 + 16 * u), _mm512_set1_ps(alphas[r]));
  for (int jj = 0; jj < kBlock; ++jj) {
    __m512 v[4];
    for (int u = 0; u < lanes; ++u) v[u] = _mm512_loadu_ps(vt + jj * Dh + d0 + 16 * u);
    for (int r = 0; r < nr; ++r) {
      if (!(masks[r] & (1u << jj))) continue;
      const __m512 pb = _mm512_set1_ps(probs[r * kBlock + jj]);
      for (int u = 0; u < lanes; ++u) o[r][u] = _mm512_fmadd_ps(pb, v[u], o[r][u]);
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int u = 0; u < lanes; ++u) _mm512_storeu_ps(acc + rows[r] * Dh + d0 + 16 * u, o[r][u]);
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
      l(rows, 0.0f), kt(Dh * kBlock), vt(kBlock * Dh), scores(rows * kBlock), alphas(rows);
  std::vector<int64_t> act_row(rows);
  std::vector<__mmask16> act_mask(rows);
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
      for (int64_t d = 0; d < Dh; d += 16)
        _mm512_storeu_ps(&vt[jj * Dh + d], vs ? Load16(vs + d) : _mm512_setzero_ps());
    }
    TransposeKeys(key_rows, Dh, kt.data());
    // Three passes over the rows that see this block (scores; softmax bookkeeping; value sums): rows are
    // independent, so each pass overlaps their dependency chains instead of running one row's chain at a time.
    int64_t active = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = len + t;
      if (!a.valid[b * a.T + t] || pos < j0) continue;
      const int64_t seen = pos - j0 + 1;  // keys j0 .. pos are causal
      const __mmask16 mask = __mmask16(key_ok & (seen >= kBlock ? 0xFFFFu : ((1u << seen) - 1u)));
      if (mask == 0) continue;
      for (int64_t g = 0; g < G; ++g) {
        act_row[active] = (t - t0) * G + g;
        act_mask[active++] = mask;
      }
    }
    for (int64_t i0 = 0; i0 < active; i0 += kScoreRows) {
      const int nr = active - i0 < kScoreRows ? int(active - i0) : kScoreRows;
      ScoreRows(q.data(), act_row.data() + i0, nr, kt.data(), Dh, scale, &scores[i0 * kBlock]);
    }
    for (int64_t i = 0; i < active; ++i) {
      const int64_t row = act_row[i];
      const __m512 s = _mm512_loadu_ps(&scores[i * kBlock]);
      const float block_max = _mm512_mask_reduce_max_ps(act_mask[i], s);
      const float m_new = m[row] > block_max ? m[row] : block_max;
      alphas[i] = ExpScalar(m[row] - m_new);
      const __m512 p = _mm512_maskz_mov_ps(act_mask[i], Exp16(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
      l[row] = l[row] * alphas[i] + _mm512_reduce_add_ps(p);
      m[row] = m_new;
      _mm512_storeu_ps(&scores[i * kBlock], p);
    }
    for (int64_t i0 = 0; i0 < active; i0 += kValueRows) {
      const int nr = active - i0 < kValueRows ? int(active - i0) : kValueRows;
      for (int64_t d0 = 0; d0 < Dh; d0 += 64)
        ValueRows(&scores[i0 * kBlock], act_mask.data() + i0, act_row.data() + i0, alphas.data() + i0, nr, vt.data(),
                  Dh, d0, acc.data());
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
  return jf_cpu::RunAttention<DT, E>("decode_attention", kRowsPerItem, JF_ATTENTION_ARGUMENTS, AttendItem<E>);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfDecodeAttentionBf16, (Attend<ffi::BF16, uint16_t>), JF_ATTENTION_BINDING(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JfDecodeAttentionF32, (Attend<ffi::F32, float>), JF_ATTENTION_BINDING(ffi::F32));
