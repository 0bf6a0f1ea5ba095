// The FMA rate of this machine's cores by the number of independent 8-lane FMA chains (accumulators) a loop keeps:
// 4, 8, 12 and 14 chains on one thread, then 12 chains on each of two threads. A GEMM kernel that keeps each
// output lane's sum in one accumulator, in a fixed k order (as the bf16 kernels do, for batch invariance), has one
// dependency chain per accumulator register, so this says what its register block can reach
// (experiments/bench_gemm_compute.py measures the kernel itself).
//   gcc -O2 -mavx2 -mfma -pthread experiments/fma_peak.c -o /tmp/fma && /tmp/fma
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#define FMAS 240000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define STEP(i) a##i = _mm256_fmadd_ps(a##i, x, y);

// ``chains`` independent accumulators, FMAS fused multiply-adds in all; returns a value that depends on every one.
static float run(int chains) {
  const __m256 x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
  // Each chain starts from its own value, read at run time: chains with equal starts compute equal values, and
  // the compiler keeps one of them (an earlier form of this file did, and so timed one chain as if it were all).
  volatile float start = 0.001f;
  const float s0 = start;
#define START(i) _mm256_set1_ps(s0 * (i + 1))
  __m256 a0 = START(0), a1 = START(1), a2 = START(2), a3 = START(3), a4 = START(4), a5 = START(5), a6 = START(6);
  __m256 a7 = START(7), a8 = START(8), a9 = START(9), a10 = START(10), a11 = START(11), a12 = START(12);
  __m256 a13 = START(13);
#undef START
  switch (chains) {
    case 4:
      for (long i = 0; i < FMAS / 4; ++i) { STEP(0) STEP(1) STEP(2) STEP(3) }
      break;
    case 8:
      for (long i = 0; i < FMAS / 8; ++i) { STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) }
      break;
    case 12:
      for (long i = 0; i < FMAS / 12; ++i) {
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) STEP(8) STEP(9) STEP(10) STEP(11)
      }
      break;
    default:
      for (long i = 0; i < FMAS / 14; ++i) {
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) STEP(8) STEP(9) STEP(10) STEP(11) STEP(12)
        STEP(13)
      }
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  return _mm256_cvtss_f32(_mm256_add_ps(s, _mm256_add_ps(a12, a13)));
}

static void* twelve(void* out) {
  *(float*)out = run(12);  // kept, so the loop is not removed
  return NULL;
}

int main(void) {
  const int chains[] = {4, 8, 12, 14};
  for (int c = 0; c < 4; ++c) {
    const double start = now();
    const float sink = run(chains[c]);
    printf("1 thread, %2d chains: %.2f G 8-lane FMAs/s (%g)\n", chains[c], FMAS / (now() - start) / 1e9, sink);
  }
  pthread_t threads[2];
  float sink[2];
  const double start = now();
  for (int i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, twelve, &sink[i]);
  for (int i = 0; i < 2; ++i) pthread_join(threads[i], NULL);
  printf("2 threads, 12 chains each: %.2f G 8-lane FMAs/s in all\n", 2 * FMAS / (now() - start) / 1e9);
  return 0;
}
