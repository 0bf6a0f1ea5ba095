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
// rounds once, as that instruction's do. The AVX-512 kernel (bf16_gemm.cc) does the same FMAs 16 lanes wide: the
// two kernels give the same bits. The order
// is fixed per row, whatever M is and whichever rows share a register block: rows never depend on each other.
#include <immintrin.h>

#include <cstdint>

#include "bf16_gemm_avx2_block.h"
#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jf_cpu::kTile;
using jf_cpu::kMaxRows;

using RowBlockFn = void (*)(const float*, int64_t, const __m256i*, int64_t, float*, int64_t);
// By row count; the first row block of a tile prefetches the weight ahead of it, the others find it in cache.
constexpr RowBlockFn kFirstRowBlocks[kMaxRows + 1] = {
    nullptr, jf_cpu::Avx2RowBlock<1, true>, jf_cpu::Avx2RowBlock<2, true>, jf_cpu::Avx2RowBlock<3, true>,
    jf_cpu::Avx2RowBlock<4, true>};
constexpr RowBlockFn kLaterRowBlocks[kMaxRows + 1] = {
    nullptr, jf_cpu::Avx2RowBlock<1, false>, jf_cpu::Avx2RowBlock<2, false>, jf_cpu::Avx2RowBlock<3, false>,
    jf_cpu::Avx2RowBlock<4, false>};

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
      const RowBlockFn block = (r0 == 0 ? kFirstRowBlocks : kLaterRowBlocks)[rows];
      block(g.x + r0 * g.K, g.K, w, g.KP, g.out + r0 * g.N + t * kTile, g.N);
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
