// A small-M bfloat16 GEMM for XLA:CPU decode steps on AVX-512 CPUs, as an XLA FFI custom call.
//
// out[M, N] (float32) = x[M, K] @ W[K, N], x given as float32 holding bf16 values (the caller casts x to bf16 and
// back), W pre-packed once at load time (pack_weight in cpu_kernels/bf16_gemm.py) as [N/16][K/2][16][2]: for a
// tile of 16 output columns and a pair of k, 32 contiguous bf16 fill one 512-bit register, each 32-bit lane the
// even k in its low half and the odd k in its high half. A mask and a shift turn the register into the float32
// weights of the two k (a bf16 is the top half of a float32).
//
// The arithmetic is that of the AVX2 kernel (bf16_gemm_avx2.cc), 16 lanes wide: each output lane accumulates
// with one fused multiply-add per k, the odd k of a pair before the even one. A bf16 x bf16 product is exact in
// float32, so every step rounds once, as _mm512_dpbf16_ps's do: the two kernels give the same bits, and that
// instruction's for normal numbers (it flushes subnormals). Plain FMAs, not _mm512_dpbf16_ps: on the AVX512-BF16
// Xeon measured (experiments/dpbf16_peak.c), a core retires four 16-lane FMAs in the time of one of those, so the
// FMAs do a pair's two products in half the time, which is what a multi-row step waits on.
//
// The order is fixed per row, whatever M is and whichever rows share a register block: a row's result does not
// depend on how many rows are computed (batch invariance, which lossless Jacobi decoding needs). The weights
// stream from memory once per call (a tile pair's later row blocks find its slabs in cache), prefetched ahead of
// the first row block: without it, a block of several rows spends long enough on each cache line that memory and
// arithmetic take turns instead of overlapping.
#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 16;      // output columns per register
constexpr int kMaxRows = 8;    // rows per register block (2 tiles x 8 rows = 16 accumulators)
// How far ahead of its reads the first row block asks for the weight; the packed slabs lie one after another,
// so the distance runs on into the next tile pair's.
constexpr int kPrefetchBytes = 8192;

// Rows [0, R) of x against the slabs of two column tiles (one when ``two`` is false); ``prefetch``: the block is
// the first to read these slabs.
template <int R, bool prefetch>
void RowBlock(const float* x, int64_t K, const __m512i* w0, const __m512i* w1, bool two, int64_t KP,
              float* out, int64_t N) {
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  const __m512i odd_mask = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t kp = 0; kp < KP; ++kp) {
    if constexpr (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(w0 + kp) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w1 + kp) + kPrefetchBytes, _MM_HINT_T0);
    }
    const __m512i p0 = _mm512_loadu_si512(w0 + kp);
    const __m512i p1 = _mm512_loadu_si512(w1 + kp);
    const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(p0, odd_mask));
    const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(p1, odd_mask));
    for (int r = 0; r < R; ++r) {
      const __m512 xo = _mm512_set1_ps(x[r * K + 2 * kp + 1]);
      acc0[r] = _mm512_fmadd_ps(xo, o0, acc0[r]);
      if (two) acc1[r] = _mm512_fmadd_ps(xo, o1, acc1[r]);
    }
    const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(p0, 16));
    const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(p1, 16));
    for (int r = 0; r < R; ++r) {
      const __m512 xe = _mm512_set1_ps(x[r * K + 2 * kp]);
      acc0[r] = _mm512_fmadd_ps(xe, e0, acc0[r]);
      if (two) acc1[r] = _mm512_fmadd_ps(xe, e1, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * N, acc0[r]);
    if (two) _mm512_storeu_ps(out + r * N + kTile, acc1[r]);
  }
}

using RowBlockFn = void (*)(const float*, int64_t, const __m512i*, const __m512i*, bool, int64_t, float*,
                            int64_t);
constexpr RowBlockFn kFirstRowBlocks[kMaxRows + 1] = {
    nullptr, RowBlock<1, true>, RowBlock<2, true>, RowBlock<3, true>, RowBlock<4, true>,
    RowBlock<5, true>, RowBlock<6, true>, RowBlock<7, true>, RowBlock<8, true>};
constexpr RowBlockFn kLaterRowBlocks[kMaxRows + 1] = {
    nullptr, RowBlock<1, false>, RowBlock<2, false>, RowBlock<3, false>, RowBlock<4, false>,
    RowBlock<5, false>, RowBlock<6, false>, RowBlock<7, false>, RowBlock<8, false>};

struct Gemm {
  const float* x;
  const __m512i* w;
  float* out;
  int64_t M, K, KP, NT, N;
};

// Column tiles [t0, t1) of the output, two tiles at a time, every row block of each pair before the next pair.
void RunTiles(const Gemm& g, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t += 2) {
    const bool two = t + 1 < t1;
    const __m512i* w0 = g.w + t * g.KP;
    const __m512i* w1 = two ? w0 + g.KP : w0;
    for (int64_t r0 = 0; r0 < g.M; r0 += kMaxRows) {
      const int64_t rows = g.M - r0 < kMaxRows ? g.M - r0 : kMaxRows;
      const RowBlockFn block = (r0 == 0 ? kFirstRowBlocks : kLaterRowBlocks)[rows];
      block(g.x + r0 * g.K, g.K, w0, w1, two, g.KP, g.out + r0 * g.N + t * kTile, g.N);
    }
  }
}

ffi::Error Bf16GemmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> packed,
                        ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  if (xd.size() != 2 || pd.size() != 4 || pd[2] != kTile || pd[3] != 2) {
    return ffi::Error::InvalidArgument("bf16_gemm: x must be [M, K] and the weight packed as [N/16, K/2, 16, 2]");
  }
  const int64_t M = xd[0], K = xd[1], NT = pd[0], KP = pd[1];
  if (K != 2 * KP) return ffi::Error::InvalidArgument("bf16_gemm: x's K does not match the packed weight");
  Gemm g{x.typed_data(), reinterpret_cast<const __m512i*>(packed.typed_data()),
         out->typed_data(), M, K, KP, NT, NT * kTile};
  jf_cpu::RunColumnTiles(pool, NT, K, M, [g](int64_t t0, int64_t t1) { RunTiles(g, t0, t1); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfBf16Gemm, Bf16GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
