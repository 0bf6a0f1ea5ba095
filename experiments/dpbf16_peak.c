// One core's rate of 16-lane float32 FMAs against that of _mm512_dpbf16_ps (VDPBF16PS: 16 lanes, each adding two
// bf16 products), 16 independent chains each, on an AVX512-BF16 CPU. Each VDPBF16PS does the products of two FMAs;
// where it retires less than half as often, a bf16 GEMM does its products faster as FMAs on bf16 values widened by
// a shift (cpu_kernels/bf16_gemm.cc).
//   gcc -O2 -mavx512f -mavx512bf16 experiments/dpbf16_peak.c -o /tmp/dpbf16 && /tmp/dpbf16
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define STEPS 100000000L  // loop trips; each runs one instruction on each of the 16 chains

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Every chain starts from its own value, read at run time, so the compiler cannot merge chains.
#define CHAINS(init)                                                                                       \
  __m512 a0 = init(0), a1 = init(1), a2 = init(2), a3 = init(3), a4 = init(4), a5 = init(5), a6 = init(6); \
  __m512 a7 = init(7), a8 = init(8), a9 = init(9), a10 = init(10), a11 = init(11), a12 = init(12);         \
  __m512 a13 = init(13), a14 = init(14), a15 = init(15);
#define ALL(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11) S(12) S(13) S(14) S(15)
#define SUM(i) s = _mm512_add_ps(s, a##i);

static volatile float start = 0.001f;
#define START(i) _mm512_set1_ps(s0 * (i + 1))

static float fmas(void) {
  const float s0 = start;
  __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  CHAINS(START)
  for (long i = 0; i < STEPS; ++i) {
    __asm__ volatile("" : "+v"(x), "+v"(y));  // x and y unknown each trip: nothing is hoisted
#define FMA(i) a##i = _mm512_fmadd_ps(a##i, x, y);
    ALL(FMA)
#undef FMA
  }
  __m512 s = _mm512_setzero_ps();
  ALL(SUM)
  return _mm512_reduce_add_ps(s);
}

static float dpbf16s(void) {
  const float s0 = start;
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x00010001);
  CHAINS(START)
  for (long i = 0; i < STEPS; ++i) {
    __asm__ volatile("" : "+v"(x), "+v"(y));
#define DP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    ALL(DP)
#undef DP
  }
  __m512 s = _mm512_setzero_ps();
  ALL(SUM)
  return _mm512_reduce_add_ps(s);
}

int main(void) {
  double t = now();
  float kept = fmas();
  const double fma_rate = 16.0 * STEPS / (now() - t) / 1e9;
  t = now();
  kept += dpbf16s();
  const double dp_rate = 16.0 * STEPS / (now() - t) / 1e9;
  printf("one thread, 16 chains: %.2f G FMA/s (16 lanes), %.2f G VDPBF16PS/s; bf16 products per second, "
         "VDPBF16PS over FMA: %.2f (%g)\n", fma_rate, dp_rate, 2 * dp_rate / fma_rate, kept);
  return 0;
}
