// Register blocks for the AVX2 bf16 GEMM (cpu_kernels/bf16_gemm_avx2.cc), timed on one thread on a weight held in
// cache: the kernel's own block (cpu_kernels/bf16_gemm_avx2_block.h: up to 4 rows x 16 columns, 8 accumulators)
// against blocks of R rows x C registers of
// 8 columns (R * C accumulators) that convert each weight register once and FMA it into every row. Every block
// does each output lane's arithmetic in the kernel's order (k pairs in order, the odd k first), so all give the
// same bits (checked). "shift" converts the odd k with two shifts instead of a mask, which frees a register.
// With "stream": the kernel's block with and without its prefetch, and the 4-row x 24-column one, over a
// model-sized weight on two threads.
//   g++ -O2 -mavx2 -mfma -std=c++17 -pthread experiments/gemm_blocks_avx2.cc -o /tmp/gb && /tmp/gb [stream]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "../cpu_kernels/bf16_gemm_avx2_block.h"  // the kernel's own block

namespace {

constexpr int64_t K = 576, N = 384, KP = K / 2, NT = N / 16;  // a 576 x 384 bf16 weight: 432 KiB
std::vector<float> x(16 * K), out(16 * N), expected(16 * N);
const __m256i* w;  // packed as the kernels pack it: [N/16][K/2][16][2]

__m256 Odd(const __m256i* p, __m256i mask) { return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(p), mask)); }
__m256 OddByShifts(const __m256i* p, __m256i) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(_mm256_loadu_si256(p), 16), 16));
}
__m256 Even(const __m256i* p, __m256i) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(p), 16)); }

// R rows x C registers (C / 2 slabs from ``ws``): per k, each weight register is converted once and used by every
// row. Accumulators are named variables (an array of them is stored to the stack every step).
#define ACC_FMA(r, c, wv) if constexpr (R > r && C > c) a##r##c = _mm256_fmadd_ps(b##r, wv, a##r##c);
#define REG(c, CONV)                                                                            \
  if constexpr (C > c) {                                                                        \
    const __m256 wv = CONV(ws + 2 * ((c) / 2) * KP + 2 * kp + ((c) & 1), mask);                 \
    ACC_FMA(0, c, wv) ACC_FMA(1, c, wv) ACC_FMA(2, c, wv) ACC_FMA(3, c, wv)                     \
  }
#define BCAST(r, k) const __m256 b##r = R > r ? _mm256_broadcast_ss(xs + r * K + (k)) : _mm256_setzero_ps();
#define K_STEP(k, CONV) { BCAST(0, k) BCAST(1, k) BCAST(2, k) BCAST(3, k) \
                          REG(0, CONV) REG(1, CONV) REG(2, CONV) REG(3, CONV) REG(4, CONV) REG(5, CONV) }
#define ZERO(r) __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0, \
                       a##r##4 = a##r##0, a##r##5 = a##r##0;
#define STORE1(r, c) if constexpr (R > r && C > c) _mm256_storeu_ps(o + r * N + 8 * (c), a##r##c);
#define STORE(r) STORE1(r, 0) STORE1(r, 1) STORE1(r, 2) STORE1(r, 3) STORE1(r, 4) STORE1(r, 5)
template <int R, int C, bool SHIFT_ODD>
void WideBlock(const float* xs, const __m256i* ws, float* o) {
  static_assert(R <= 4 && C <= 6 && C % 2 == 0);
  ZERO(0) ZERO(1) ZERO(2) ZERO(3)
  const __m256i mask = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t kp = 0; kp < KP; ++kp) {
    if constexpr (SHIFT_ODD) { K_STEP(2 * kp + 1, OddByShifts) } else { K_STEP(2 * kp + 1, Odd) }
    K_STEP(2 * kp, Even)
  }
  STORE(0) STORE(1) STORE(2) STORE(3)
}

// The kernel's block for ``rows`` (1-4) rows of x against the slab at ``s``, into an output of ``n_out`` columns.
template <bool prefetch>
void KernelRowBlock(int rows, const float* xs, const __m256i* s, float* o, int64_t n_out) {
  switch (rows) {
    case 1: jf_cpu::Avx2RowBlock<1, prefetch>(xs, K, s, KP, o, n_out); break;
    case 2: jf_cpu::Avx2RowBlock<2, prefetch>(xs, K, s, KP, o, n_out); break;
    case 3: jf_cpu::Avx2RowBlock<3, prefetch>(xs, K, s, KP, o, n_out); break;
    default: jf_cpu::Avx2RowBlock<4, prefetch>(xs, K, s, KP, o, n_out);
  }
}

void RunKernel(int M) {
  for (int64_t t = 0; t < NT; ++t) {
    for (int r0 = 0; r0 < M; r0 += 4) {
      const int rows = M - r0 < 4 ? M - r0 : 4;
      KernelRowBlock<false>(rows, x.data() + r0 * K, w + 2 * t * KP, out.data() + r0 * N + t * 16, N);
    }
  }
}

template <int R, int C, bool SHIFT_ODD>
void RunWide(int M) {  // M a multiple of R
  for (int64_t t = 0; t < NT; t += C / 2) {
    for (int r0 = 0; r0 < M; r0 += R) WideBlock<R, C, SHIFT_ODD>(x.data() + r0 * K, w + 2 * t * KP, out.data() + r0 * N + t * 16);
  }
}

// Six rows x one 16-column slab with the registers allocated by hand: 12 accumulators (ymm0-11), the two weight
// registers of a k (ymm12-13), the broadcast (ymm14) and the odd-k mask (ymm15). The even k's weights are loaded
// again (from cache) instead of being kept, which is what frees the registers.
void SixRowsAsm(const float* xs, const __m256i* ws, float* o) {
  const int32_t mask_bits[8] = {-65536, -65536, -65536, -65536, -65536, -65536, -65536, -65536};
  const int64_t stride = K * 4;
  const float* x3 = xs + 3 * K;
  int64_t count = KP;
  asm volatile(
      "vmovdqu (%[m]), %%ymm15\n\t"
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\tvxorps %%ymm1, %%ymm1, %%ymm1\n\tvxorps %%ymm2, %%ymm2, %%ymm2\n\t"
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\tvxorps %%ymm4, %%ymm4, %%ymm4\n\tvxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\tvxorps %%ymm7, %%ymm7, %%ymm7\n\tvxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\tvxorps %%ymm10, %%ymm10, %%ymm10\n\tvxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "1:\n\t"
      "vpand (%[w]), %%ymm15, %%ymm12\n\tvpand 32(%[w]), %%ymm15, %%ymm13\n\t"
#define JF_ROW(disp, addr, a, b)                                                               \
      "vbroadcastss " disp addr ", %%ymm14\n\t"                                                \
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm" a "\n\tvfmadd231ps %%ymm13, %%ymm14, %%ymm" b "\n\t"
      JF_ROW("4", "(%[x0])", "0", "1") JF_ROW("4", "(%[x0],%[s],1)", "2", "3") JF_ROW("4", "(%[x0],%[s],2)", "4", "5")
      JF_ROW("4", "(%[x3])", "6", "7") JF_ROW("4", "(%[x3],%[s],1)", "8", "9") JF_ROW("4", "(%[x3],%[s],2)", "10", "11")
      "vmovdqu (%[w]), %%ymm12\n\tvmovdqu 32(%[w]), %%ymm13\n\t"  // AVX2 shifts take no memory operand
      "vpslld $16, %%ymm12, %%ymm12\n\tvpslld $16, %%ymm13, %%ymm13\n\t"
      JF_ROW("", "(%[x0])", "0", "1") JF_ROW("", "(%[x0],%[s],1)", "2", "3") JF_ROW("", "(%[x0],%[s],2)", "4", "5")
      JF_ROW("", "(%[x3])", "6", "7") JF_ROW("", "(%[x3],%[s],1)", "8", "9") JF_ROW("", "(%[x3],%[s],2)", "10", "11")
#undef JF_ROW
      "add $64, %[w]\n\tadd $8, %[x0]\n\tadd $8, %[x3]\n\tdec %[n]\n\tjnz 1b\n\t"
      "vmovups %%ymm0, (%[o])\n\tvmovups %%ymm1, 32(%[o])\n\t"
      "vmovups %%ymm2, (%[o],%[t],1)\n\tvmovups %%ymm3, 32(%[o],%[t],1)\n\t"
      "vmovups %%ymm4, (%[o],%[t],2)\n\tvmovups %%ymm5, 32(%[o],%[t],2)\n\t"
      "lea (%[o],%[t],2), %[o]\n\tadd %[t], %[o]\n\t"
      "vmovups %%ymm6, (%[o])\n\tvmovups %%ymm7, 32(%[o])\n\t"
      "vmovups %%ymm8, (%[o],%[t],1)\n\tvmovups %%ymm9, 32(%[o],%[t],1)\n\t"
      "vmovups %%ymm10, (%[o],%[t],2)\n\tvmovups %%ymm11, 32(%[o],%[t],2)\n\t"
      "vzeroupper\n\t"
      : [w] "+r"(ws), [x0] "+r"(xs), [x3] "+r"(x3), [n] "+r"(count), [o] "+r"(o)
      : [s] "r"(stride), [t] "r"(N * 4), [m] "r"(mask_bits)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

void RunSixRowsAsm(int M) {  // M a multiple of 6
  for (int64_t t = 0; t < NT; ++t) {
    for (int r0 = 0; r0 < M; r0 += 6) SixRowsAsm(x.data() + r0 * K, w + 2 * t * KP, out.data() + r0 * N + t * 16);
  }
}

// Four rows x 24 columns (three 8-column registers, which may lie in two slabs: ``w0``, ``w1``, ``w2`` point at each
// register's first k pair, and every register steps 64 bytes per pair), with twelve accumulators: one FMA chain per
// accumulator. (Eight chains already keep a Zen 3 core's two FMA units busy, experiments/fma_peak.c; what this block
// saves is broadcasts per FMA, each of x serving three weight registers.) Twelve accumulators, three weights and a
// broadcast are all sixteen AVX2 registers, which a compiler cannot keep without spilling, so the registers are
// allocated by hand: accumulators ymm0-11 (row r, register c in ymm(3r + c)), weights ymm12-14, the broadcast ymm15;
// the odd-k mask is read from memory. Each output lane's arithmetic is the kernel block's: the same FMAs in the same
// order, the same bits.
void FourRowsBy24Asm(const float* xs, const __m256i* w0, const __m256i* w1, const __m256i* w2, float* o,
                     int64_t n_out) {
  alignas(32) static const int32_t odd_mask[8] = {-65536, -65536, -65536, -65536, -65536, -65536, -65536, -65536};
  const int64_t x_stride = K * 4, out_stride = n_out * 4;
  const float* x3 = xs + 3 * K;
  int64_t pairs = KP;
  asm volatile(
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\tvxorps %%ymm1, %%ymm1, %%ymm1\n\tvxorps %%ymm2, %%ymm2, %%ymm2\n\t"
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\tvxorps %%ymm4, %%ymm4, %%ymm4\n\tvxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\tvxorps %%ymm7, %%ymm7, %%ymm7\n\tvxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\tvxorps %%ymm10, %%ymm10, %%ymm10\n\tvxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "1:\n\t"
      // the odd k of the pair: the high half of each 32-bit lane
      "vmovdqu (%[w0]), %%ymm12\n\tvpand (%[m]), %%ymm12, %%ymm12\n\t"
      "vmovdqu (%[w1]), %%ymm13\n\tvpand (%[m]), %%ymm13, %%ymm13\n\t"
      "vmovdqu (%[w2]), %%ymm14\n\tvpand (%[m]), %%ymm14, %%ymm14\n\t"
#define JF_ROW(disp, addr, a, b, c)                                                                  \
      "vbroadcastss " disp addr ", %%ymm15\n\t"                                                      \
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm" a "\n\tvfmadd231ps %%ymm13, %%ymm15, %%ymm" b "\n\t"    \
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm" c "\n\t"
      JF_ROW("4", "(%[x0])", "0", "1", "2") JF_ROW("4", "(%[x0],%[xs],1)", "3", "4", "5")
      JF_ROW("4", "(%[x0],%[xs],2)", "6", "7", "8") JF_ROW("4", "(%[x3])", "9", "10", "11")
      // the even k: the low half, shifted up (AVX2's immediate shifts take no memory operand)
      "vmovdqu (%[w0]), %%ymm12\n\tvpslld $16, %%ymm12, %%ymm12\n\t"
      "vmovdqu (%[w1]), %%ymm13\n\tvpslld $16, %%ymm13, %%ymm13\n\t"
      "vmovdqu (%[w2]), %%ymm14\n\tvpslld $16, %%ymm14, %%ymm14\n\t"
      JF_ROW("", "(%[x0])", "0", "1", "2") JF_ROW("", "(%[x0],%[xs],1)", "3", "4", "5")
      JF_ROW("", "(%[x0],%[xs],2)", "6", "7", "8") JF_ROW("", "(%[x3])", "9", "10", "11")
#undef JF_ROW
      "add $64, %[w0]\n\tadd $64, %[w1]\n\tadd $64, %[w2]\n\tadd $8, %[x0]\n\tadd $8, %[x3]\n\t"
      "dec %[n]\n\tjnz 1b\n\t"
      "vmovups %%ymm0, (%[o])\n\tvmovups %%ymm1, 32(%[o])\n\tvmovups %%ymm2, 64(%[o])\n\t"
      "add %[os], %[o]\n\t"
      "vmovups %%ymm3, (%[o])\n\tvmovups %%ymm4, 32(%[o])\n\tvmovups %%ymm5, 64(%[o])\n\t"
      "add %[os], %[o]\n\t"
      "vmovups %%ymm6, (%[o])\n\tvmovups %%ymm7, 32(%[o])\n\tvmovups %%ymm8, 64(%[o])\n\t"
      "add %[os], %[o]\n\t"
      "vmovups %%ymm9, (%[o])\n\tvmovups %%ymm10, 32(%[o])\n\tvmovups %%ymm11, 64(%[o])\n\t"
      "vzeroupper\n\t"
      : [w0] "+r"(w0), [w1] "+r"(w1), [w2] "+r"(w2), [x0] "+r"(xs), [x3] "+r"(x3), [n] "+r"(pairs), [o] "+r"(o)
      : [xs] "r"(x_stride), [os] "r"(out_stride), [m] "r"(odd_mask)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}


// Four rows against three slabs from ``s`` (48 columns: registers 0-5 of 8 columns), as two 24-column blocks.
void FourRowsByThreeSlabs(const float* xs, const __m256i* s, float* o, int64_t n_out) {
  FourRowsBy24Asm(xs, s, s + 1, s + 2 * KP, o, n_out);
  FourRowsBy24Asm(xs, s + 2 * KP + 1, s + 4 * KP, s + 4 * KP + 1, o + 24, n_out);
}

void RunFourBy24(int M) {  // M a multiple of 4; NT a multiple of 3
  for (int64_t t = 0; t < NT; t += 3) {
    for (int r0 = 0; r0 < M; r0 += 4) {
      FourRowsByThreeSlabs(x.data() + r0 * K, w + 2 * t * KP, out.data() + r0 * N + t * 16, N);
    }
  }
}

// The same two blocks streaming a model-sized weight from memory, as a forward does: 576 x 234,240 bf16 (270 MB,
// SmolLM2-135M's weights), split in two halves of slabs over two threads. What a forward of M tokens costs in
// weight products against a one-token step.
constexpr int64_t kStreamTiles = 14640, kStreamN = kStreamTiles * 16;
const __m256i* stream_w;
std::vector<float> stream_out(16 * kStreamN);

enum class Streamer { kNoPrefetch, kKernel, kFourBy24 };
const char* const kStreamerNames[] = {"kernel block, no prefetch", "kernel (first block prefetches)",
                                      "4 rows x 3 regs, asm"};

void StreamTiles(Streamer how, int M, int64_t t0, int64_t t1) {
  if (how == Streamer::kFourBy24 && M % 4 == 0) {
    for (; t0 + 3 <= t1; t0 += 3) {
      for (int r0 = 0; r0 < M; r0 += 4) {
        FourRowsByThreeSlabs(x.data() + r0 * K, stream_w + 2 * t0 * KP, stream_out.data() + r0 * kStreamN + t0 * 16,
                             kStreamN);
      }
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    for (int r0 = 0; r0 < M; r0 += 4) {
      const int rows = M - r0 < 4 ? M - r0 : 4;
      const float* xs = x.data() + r0 * K;
      const __m256i* s = stream_w + 2 * t * KP;
      float* o = stream_out.data() + r0 * kStreamN + t * 16;
      if (how == Streamer::kKernel && r0 == 0) {
        KernelRowBlock<true>(rows, xs, s, o, kStreamN);
      } else {
        KernelRowBlock<false>(rows, xs, s, o, kStreamN);
      }
    }
  }
}

double StreamOnce(Streamer how, int M) {
  const auto start = std::chrono::steady_clock::now();
  std::thread helper([=] { StreamTiles(how, M, kStreamTiles / 2, kStreamTiles); });
  StreamTiles(how, M, 0, kStreamTiles / 2);
  helper.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Stream() {
  auto* bits = static_cast<uint16_t*>(std::aligned_alloc(64, kStreamN * K * 2));
  for (int64_t i = 0; i < kStreamN * K; ++i) bits[i] = 0x3c00 + ((i * 7) & 0x3ff);
  stream_w = reinterpret_cast<const __m256i*>(bits);
  for (int round = 0; round < 3; ++round) {  // the blocks alternate, so drift hits all alike
    for (int M : {1, 4, 8, 16}) {
      for (Streamer how : {Streamer::kNoPrefetch, Streamer::kKernel, Streamer::kFourBy24}) {
        if (how == Streamer::kFourBy24 && M % 4) continue;
        std::vector<double> times;
        for (int i = 0; i < 15; ++i) times.push_back(StreamOnce(how, M));
        std::sort(times.begin(), times.end());
        std::printf("stream, round %d, %2d rows, %-31s median %6.2f ms (%4.1f GB/s)\n", round, M,
                    kStreamerNames[static_cast<int>(how)], times[7] * 1e3, kStreamN * K * 2 / times[7] / 1e9);
      }
    }
  }
}

void Time(const char* name, int M, void (*run)(int)) {
  run(M);
  const bool same = std::memcmp(out.data(), expected.data(), M * N * sizeof(float)) == 0;
  const int reps = 3000 / M;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) run(M);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  std::printf("%2d rows  %-28s %5.2f G 8-lane FMAs/s%s\n", M, name, M * K * N / 8 / s / 1e9,
              same ? "" : "  (BITS DIFFER FROM THE KERNEL'S)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "stream") == 0) {
    Stream();
    return 0;
  }
  auto* bits = static_cast<uint16_t*>(std::aligned_alloc(64, N * K * 2));
  std::srand(1);
  for (int64_t i = 0; i < N * K; ++i) bits[i] = 0x3c00 + (std::rand() & 0x3ff) + ((std::rand() & 1) << 15);
  w = reinterpret_cast<const __m256i*>(bits);
  for (auto& v : x) {
    const uint32_t u = (0x3c00u + (std::rand() & 0x3ff)) << 16;
    std::memcpy(&v, &u, 4);
  }
  for (int M : {1, 4, 6, 8, 12}) {
    RunKernel(M);
    expected = out;
    Time("kernel (<=4 rows x 2 regs)", M, RunKernel);
    if (M == 1) {
      Time("1 row x 4 regs", M, RunWide<1, 4, false>);
      Time("1 row x 6 regs", M, RunWide<1, 6, false>);
    }
    if (M % 2 == 0) {
      Time("2 rows x 4 regs", M, RunWide<2, 4, false>);
      Time("2 rows x 6 regs (12 acc)", M, RunWide<2, 6, false>);
      Time("2 rows x 6 regs, shift", M, RunWide<2, 6, true>);
    }
    if (M % 4 == 0) Time("4 rows x 2 regs, w outer", M, RunWide<4, 2, false>);
    if (M % 3 == 0) Time("3 rows x 4 regs, shift (12 acc)", M, RunWide<3, 4, true>);
    if (M % 6 == 0) Time("6 rows x 2 regs, asm (12 acc)", M, RunSixRowsAsm);
    if (M % 4 == 0) Time("4 rows x 3 regs, asm (12 acc)", M, RunFourBy24);
  }
  return 0;
}
