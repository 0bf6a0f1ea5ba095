// The small-M bfloat16 GEMM of bf16_gemm.cc for CPUs with AVX2 and FMA only (no AVX-512), as an XLA FFI custom call.
//
// out[M, N] (float32) = x[M, K] @ W[K, N], x given as float32 holding bf16 values (the caller casts x to bf16 and
// back, so the product is the bf16 one), W packed as for the AVX-512 kernel: [N/16][K/2][16][2] bf16. A 64-byte
// slab of that layout holds 16 output columns x one pair of k, as two 256-bit registers of 8 columns; in each
// 32-bit lane the even k is the low half and the odd k the high half, so a shift and a mask turn a register into
// the float32 weights of the two k (a bf16 is the top half of a float32) without any conversion instruction.
//
// Each output lane accumulates with one fused multiply-add per k, the odd k of a pair before the even one: the
// order in which _mm512_dpbf16_ps accumulates its pair. A bf16 x bf16 product is exact in float32, so each step
// rounds once, as that instruction's do, and for normal numbers the two kernels give the same bits. The order
// is fixed per row, whatever M is and whichever rows share a register block: rows never depend on each other.
#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 16;    // output columns per packed slab: two 8-lane registers
constexpr int kMaxRows = 4;  // rows per register block: 8 accumulators + 4 weight registers + broadcasts in 16

// One FMA of row ``r``'s x[k] into its two accumulators, for the rows a block has. The accumulators are named
// variables, not arrays: GCC keeps an array of vectors in registers but also stores it to the stack every step.
#define JF_ROW_FMA(r, k)                                           \
  if constexpr (R > r) {                                           \
    const __m256 xk = _mm256_broadcast_ss(x + r * K + (k));        \
    lo##r = _mm256_fmadd_ps(xk, w_lo, lo##r);                      \
    hi##r = _mm256_fmadd_ps(xk, w_hi, hi##r);                      \
  }
#define JF_ROWS_FMA(k) JF_ROW_FMA(0, k) JF_ROW_FMA(1, k) JF_ROW_FMA(2, k) JF_ROW_FMA(3, k)

template <int R>
void RowBlock(const float* x, int64_t K, const __m256i* w, int64_t KP, float* out, int64_t N) {
  static_assert(R >= 1 && R <= 4);
  __m256 lo0 = _mm256_setzero_ps(), lo1 = lo0, lo2 = lo0, lo3 = lo0;  // columns 0-7 of rows 0-3
  __m256 hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;                  // columns 8-15
  const __m256i odd_mask = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t kp = 0; kp < KP; ++kp) {
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

using RowBlockFn = void (*)(const float*, int64_t, const __m256i*, int64_t, float*, int64_t);
constexpr RowBlockFn kRowBlocks[kMaxRows + 1] = {nullptr, RowBlock<1>, RowBlock<2>, RowBlock<3>, RowBlock<4>};

struct Gemm {
  const float* x;
  const __m256i* w;  // two registers per (tile, k pair)
  float* out;
  int64_t M, K, KP, N;
};

// Column tiles [t0, t1) of the output, every row block of a tile before the next tile (the tile's slab stays
// in cache for the row blocks after the first).
void RunTiles(const Gemm& g, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const __m256i* w = g.w + 2 * t * g.KP;
    for (int64_t r0 = 0; r0 < g.M; r0 += kMaxRows) {
      const int64_t rows = g.M - r0 < kMaxRows ? g.M - r0 : kMaxRows;
      kRowBlocks[rows](g.x + r0 * g.K, g.K, w, g.KP, g.out + r0 * g.N + t * kTile, g.N);
    }
  }
}

ffi::Error Bf16GemmAvx2Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> packed,
                            ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  if (xd.size() != 2 || pd.size() != 4 || pd[2] != kTile || pd[3] != 2) {
    return ffi::Error::InvalidArgument(
        "bf16_gemm_avx2: x must be [M, K] and the weight packed as [N/16, K/2, 16, 2]");
  }
  const int64_t M = xd[0], K = xd[1], NT = pd[0], KP = pd[1];
  if (K != 2 * KP) return ffi::Error::InvalidArgument("bf16_gemm_avx2: x's K does not match the packed weight");
  Gemm g{x.typed_data(), reinterpret_cast<const __m256i*>(packed.typed_data()), out->typed_data(), M, K, KP,
         NT * kTile};
  jf_cpu::RunColumnTiles(pool, NT, K, M, [g](int64_t t0, int64_t t1) { RunTiles(g, t0, t1); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfBf16GemmAvx2, Bf16GemmAvx2Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
