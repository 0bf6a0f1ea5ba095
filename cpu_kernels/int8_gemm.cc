// The W8A8 matmul of XLA:CPU decode steps (small M), as an XLA FFI custom call.
//
// out[M, N] (float32) = (xq[M, K] @ W[K, N]) * sx[M] * scale[N], where xq = round(x / sx) is x quantised per row
// to int8 (sx = max|x[m]| * (1/127), 1 for a zero row; round half to even, clipped to +-127), W the int8 weight and
// scale its per-output-channel scale; the int8 product is an exact int32 sum. The same float operations as
// the plain-JAX twin (w8a8_reference in cpu_kernels/int8_gemm.py), hence the same bits. W is packed once at load time (pack_int8 in cpu_kernels/int8_gemm.py) as [N/16][K/4][16][4]: for a tile of 16
// output columns and a group of 4 k, 64 contiguous int8 form one AVX512 register, the operand layout of
// _mm512_dpbusd_epi32 (AVX512-VNNI: u8 x s8 products summed in groups of 4 into int32 lanes). The unsigned
// operand is x + 128 (x's bytes xor 0x80), so the product over-counts 128 * colsum(W), subtracted at the end
// with the column sums packed beside the weight. Integer sums are exact, so every row's result is the same
// whatever M, the row blocking or the threads: batch-invariant by construction, and equal to XLA's int dot.
// Half the bytes of the bf16 kernel per weight and twice its multiply-adds per instruction; quantising and
// rescaling inside the call saves the ~100 us that a dozen small XLA ops around an int8 dot cost per matmul.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 16;    // output columns per register
constexpr int kMaxRows = 8;  // rows per register block (2 tiles x 8 rows = 16 accumulators)

template <int R>
void RowBlock(const int8_t* x, int64_t K, const __m512i* w0, const __m512i* w1, bool two, int64_t KQ,
              const int32_t* bias, const float* sx, const float* scale, float* out, int64_t N) {
  __m512i acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_si512();
    acc1[r] = _mm512_setzero_si512();
  }
  const __m512i flip = _mm512_set1_epi32(int32_t(0x80808080u));
  for (int64_t kq = 0; kq < KQ; ++kq) {
    const __m512i b0 = _mm512_loadu_si512(w0 + kq);
    const __m512i b1 = _mm512_loadu_si512(w1 + kq);
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, x + r * K + 4 * kq, sizeof(quad));
      const __m512i a = _mm512_xor_si512(_mm512_set1_epi32(quad), flip);  // x + 128 as unsigned bytes
      acc0[r] = _mm512_dpbusd_epi32(acc0[r], a, b0);
      if (two) acc1[r] = _mm512_dpbusd_epi32(acc1[r], a, b1);
    }
  }
  const __m512i c0 = _mm512_loadu_si512(bias), c1 = two ? _mm512_loadu_si512(bias + kTile) : c0;
  const __m512 s0 = _mm512_loadu_ps(scale), s1 = two ? _mm512_loadu_ps(scale + kTile) : s0;
  for (int r = 0; r < R; ++r) {  // (float(acc) * sx) * scale, in that order, as the twin computes it
    const __m512 row_scale = _mm512_set1_ps(sx[r]);
    const __m512 y0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc0[r], c0)), row_scale);
    _mm512_storeu_ps(out + r * N, _mm512_mul_ps(y0, s0));
    if (two) {
      const __m512 y1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc1[r], c1)), row_scale);
      _mm512_storeu_ps(out + r * N + kTile, _mm512_mul_ps(y1, s1));
    }
  }
}

using RowBlockFn = void (*)(const int8_t*, int64_t, const __m512i*, const __m512i*, bool, int64_t, const int32_t*,
                            const float*, const float*, float*, int64_t);
constexpr RowBlockFn kRowBlocks[kMaxRows + 1] = {nullptr,      RowBlock<1>, RowBlock<2>, RowBlock<3>, RowBlock<4>,
                                                 RowBlock<5>, RowBlock<6>, RowBlock<7>, RowBlock<8>};

struct Gemm {
  const int8_t* x;      // quantised rows
  const float* sx;      // their scales
  const __m512i* w;
  const int32_t* bias;  // 128 * column sums of W
  const float* scale;   // per output channel
  float* out;
  int64_t M, K, KQ, NT, N;
};

// Column tiles [t0, t1), two at a time, every row block of each pair before the next pair.
void RunTiles(const Gemm& g, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t += 2) {
    const bool two = t + 1 < t1;
    const __m512i* w0 = g.w + t * g.KQ;
    const __m512i* w1 = two ? w0 + g.KQ : w0;
    for (int64_t r0 = 0; r0 < g.M; r0 += kMaxRows) {
      const int64_t rows = g.M - r0 < kMaxRows ? g.M - r0 : kMaxRows;
      kRowBlocks[rows](g.x + r0 * g.K, g.K, w0, w1, two, g.KQ, g.bias + t * kTile, g.sx + r0, g.scale + t * kTile,
                       g.out + r0 * g.N + t * kTile, g.N);
    }
  }
}

// Row m of x to int8 (as quantize_rows in the twin): sx = max|x| * (1/127) (1 if 0), q = clip(round_even(x / sx)).
template <typename E>
void QuantizeRow(const E* x, int64_t K, int8_t* q, float* sx) {
  float top = 0.0f;
  for (int64_t k = 0; k < K; ++k) top = std::max(top, std::fabs(jf_cpu::ToF32(x[k])));
  float s = top * (1.0f / 127.0f);  // a product, as XLA computes the twin's division by a constant
  if (!(s > 0.0f)) s = 1.0f;
  *sx = s;
  for (int64_t k = 0; k < K; ++k) {
    // std::nearbyint: the default rounding mode, to nearest with ties to even, as the twin rounds
    const float v = std::nearbyint(jf_cpu::ToF32(x[k]) / s);
    q[k] = int8_t(std::min(127.0f, std::max(-127.0f, v)));
  }
}

template <ffi::DataType DT, typename E>
ffi::Error W8A8Impl(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<ffi::S8> packed, ffi::Buffer<ffi::S32> bias,
                    ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  if (xd.size() != 2 || pd.size() != 4 || pd[2] != kTile || pd[3] != 4) {
    return ffi::Error::InvalidArgument("int8_gemm: x must be [M, K] and the weight packed as [N/16, K/4, 16, 4]");
  }
  const int64_t M = xd[0], K = xd[1], NT = pd[0], KQ = pd[1];
  if (K != 4 * KQ) return ffi::Error::InvalidArgument("int8_gemm: x's K does not match the packed weight");
  if (bias.dimensions().size() != 1 || bias.dimensions()[0] != NT * kTile || scale.dimensions().size() != 1 ||
      scale.dimensions()[0] != NT * kTile) {
    return ffi::Error::InvalidArgument("int8_gemm: the column-sum bias and the scales must have N/16 * 16 entries");
  }
  std::vector<int8_t> xq(M * K);
  std::vector<float> sx(M);
  const E* xs = reinterpret_cast<const E*>(x.typed_data());
  for (int64_t m = 0; m < M; ++m) QuantizeRow(xs + m * K, K, xq.data() + m * K, sx.data() + m);
  Gemm g{xq.data(), sx.data(), reinterpret_cast<const __m512i*>(packed.typed_data()), bias.typed_data(),
         scale.typed_data(), out->typed_data(), M, K, KQ, NT, NT * kTile};
  jf_cpu::RunColumnTiles(pool, NT, K, M, [g](int64_t t0, int64_t t1) { RunTiles(g, t0, t1); });
  return ffi::Error::Success();
}

}  // namespace

#define JF_W8A8_BINDING(DT)             \
  ffi::Ffi::Bind()                      \
      .Ctx<ffi::ThreadPool>()           \
      .Arg<ffi::Buffer<DT>>()           \
      .Arg<ffi::Buffer<ffi::S8>>()      \
      .Arg<ffi::Buffer<ffi::S32>>()     \
      .Arg<ffi::Buffer<ffi::F32>>()     \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfW8A8Bf16, (W8A8Impl<ffi::BF16, uint16_t>), JF_W8A8_BINDING(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JfW8A8F32, (W8A8Impl<ffi::F32, float>), JF_W8A8_BINDING(ffi::F32));
