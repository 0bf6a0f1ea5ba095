// The register block of the AVX2 bf16 GEMM (bf16_gemm_avx2.cc says what it computes and in which order): up to
// four rows of x against one packed 16-column slab. A header of its own, without XLA, so that
// experiments/gemm_blocks_avx2.cc times this very code against other blocks.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace jf_cpu {

constexpr int kTile = 16;    // output columns per packed slab: two 8-lane registers
constexpr int kMaxRows = 4;  // rows per register block: 8 accumulators + 4 weight registers + broadcasts in 16
// How far ahead of its reads a block that streams the weight from memory asks for it. A multi-row block spends
// long enough on each cache line that the hardware prefetcher alone lets the memory stream and the arithmetic
// take turns instead of overlapping; the packed slabs lie one after another, so a fixed distance runs on into
// the next tile's slab.
constexpr int kPrefetchBytes = 8192;

// One FMA of row ``r``'s x[k] into its two accumulators, for the rows a block has. The accumulators are named
// variables, not arrays: GCC keeps an array of vectors in registers but also stores it to the stack every step.
#define JF_ROW_FMA(r, k)                                           \
  if constexpr (R > r) {                                           \
    const __m256 xk = _mm256_broadcast_ss(x + r * K + (k));        \
    lo##r = _mm256_fmadd_ps(xk, w_lo, lo##r);                      \
    hi##r = _mm256_fmadd_ps(xk, w_hi, hi##r);                      \
  }
#define JF_ROWS_FMA(k) JF_ROW_FMA(0, k) JF_ROW_FMA(1, k) JF_ROW_FMA(2, k) JF_ROW_FMA(3, k)

// ``prefetch``: the block is the first to read this slab (the tile's other row blocks find it in cache).
template <int R, bool prefetch>
inline void Avx2RowBlock(const float* x, int64_t K, const __m256i* w, int64_t KP, float* out, int64_t N) {
  static_assert(R >= 1 && R <= 4);
  __m256 lo0 = _mm256_setzero_ps(), lo1 = lo0, lo2 = lo0, lo3 = lo0;  // columns 0-7 of rows 0-3
  __m256 hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;                  // columns 8-15
  const __m256i odd_mask = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t kp = 0; kp < KP; ++kp) {
    if constexpr (prefetch) _mm_prefetch(reinterpret_cast<const char*>(w + 2 * kp) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i lo_pair = _mm256_loadu_si256(w + 2 * kp);  // columns 0-7, both k of the pair
    const __m256i hi_pair = _mm256_loadu_si256(w + 2 * kp + 1);
    __m256 w_lo = _mm256_castsi256_ps(_mm256_and_si256(lo_pair, odd_mask));
    __m256 w_hi = _mm256_castsi256_ps(_mm256_and_si256(hi_pair, odd_mask));
    JF_ROWS_FMA(2 * kp + 1)
    w_lo = _mm256_castsi256_ps(_mm256_slli_epi32(lo_pair, 16));
    w_hi = _mm256_castsi256_ps(_mm256_slli_epi32(hi_pair, 16));
    JF_ROWS_FMA(2 * kp)
  }
  const __m256 los[4] = {lo0, lo1, lo2, lo3}, his[4] = {hi0, hi1, hi2, hi3};
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * N, los[r]);
    _mm256_storeu_ps(out + r * N + 8, his[r]);
  }
}
#undef JF_ROWS_FMA
#undef JF_ROW_FMA

}  // namespace jf_cpu
