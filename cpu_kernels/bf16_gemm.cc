// A small-M bfloat16 GEMM for XLA:CPU decode steps, as an XLA FFI custom call.
//
// out[M, N] (float32) = x[M, K] (bf16) @ W[K, N] (bf16), with W pre-packed once at load time (pack_weight in
// cpu_kernels/bf16_gemm.py) as [N/16][K/2][16][2]: for a tile of 16 output columns and a pair of k, 32
// contiguous bf16 form one AVX512 register, the operand layout of _mm512_dpbf16_ps. Each output lane
// accumulates its k pairs in increasing order in one float32 register, whatever M is and whichever rows share
// a register block: a row's result does not depend on how many rows are computed (batch invariance, which
// lossless Jacobi decoding needs). The weights stream from memory once per call (row blocks reuse a column
// tile's slab from cache), so a step of 2..16 rows costs about what one row does until compute catches up.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 16;      // output columns per register
constexpr int kMaxRows = 8;    // rows per register block (2 tiles x 8 rows = 16 accumulators)

template <int R>
void RowBlock(const uint16_t* x, int64_t K, const __m512bh* w0, const __m512bh* w1, bool two, int64_t KP,
              float* out, int64_t N) {
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  for (int64_t kp = 0; kp < KP; ++kp) {
    const __m512bh b0 = w0[kp];
    const __m512bh b1 = w1[kp];
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * K + 2 * kp, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], a, b0);
      if (two) acc1[r] = _mm512_dpbf16_ps(acc1[r], a, b1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * N, acc0[r]);
    if (two) _mm512_storeu_ps(out + r * N + kTile, acc1[r]);
  }
}

using RowBlockFn = void (*)(const uint16_t*, int64_t, const __m512bh*, const __m512bh*, bool, int64_t, float*,
                            int64_t);
constexpr RowBlockFn kRowBlocks[kMaxRows + 1] = {nullptr,      RowBlock<1>, RowBlock<2>, RowBlock<3>, RowBlock<4>,
                                                 RowBlock<5>, RowBlock<6>, RowBlock<7>, RowBlock<8>};

struct Gemm {
  const uint16_t* x;
  const __m512bh* w;
  float* out;
  int64_t M, K, KP, NT, N;
};

// Column tiles [t0, t1) of the output, two tiles at a time, every row block of each pair before the next pair.
void RunTiles(const Gemm& g, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t += 2) {
    const bool two = t + 1 < t1;
    const __m512bh* w0 = g.w + t * g.KP;
    const __m512bh* w1 = two ? w0 + g.KP : w0;
    for (int64_t r0 = 0; r0 < g.M; r0 += kMaxRows) {
      const int64_t rows = g.M - r0 < kMaxRows ? g.M - r0 : kMaxRows;
      kRowBlocks[rows](g.x + r0 * g.K, g.K, w0, w1, two, g.KP, g.out + r0 * g.N + t * kTile, g.N);
    }
  }
}

ffi::Error Bf16GemmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> packed,
                        ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  if (xd.size() != 2 || pd.size() != 4 || pd[2] != kTile || pd[3] != 2) {
    return ffi::Error::InvalidArgument("bf16_gemm: x must be [M, K] and the weight packed as [N/16, K/2, 16, 2]");
  }
  const int64_t M = xd[0], K = xd[1], NT = pd[0], KP = pd[1];
  if (K != 2 * KP) return ffi::Error::InvalidArgument("bf16_gemm: x's K does not match the packed weight");
  Gemm g{reinterpret_cast<const uint16_t*>(x.typed_data()), reinterpret_cast<const __m512bh*>(packed.typed_data()),
         out->typed_data(), M, K, KP, NT, NT * kTile};
  jf_cpu::RunColumnTiles(pool, NT, K, M, [g](int64_t t0, int64_t t1) { RunTiles(g, t0, t1); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfBf16Gemm, Bf16GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
