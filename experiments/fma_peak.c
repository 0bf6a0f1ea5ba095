// The FMA peak of this machine's cores: 12 independent chains of 8-lane fused multiply-adds per thread, on one and
// then two threads (experiments/bench_gemm_compute.py compares the bf16 GEMM with it).
//   gcc -O2 -mavx2 -mfma -pthread experiments/fma_peak.c -o /tmp/fma && /tmp/fma
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#define FMAS 400000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* work(void* out) {
  const __m256 x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  __m256 a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  for (long i = 0; i < FMAS / 12; ++i) {
    a0 = _mm256_fmadd_ps(a0, x, y); a1 = _mm256_fmadd_ps(a1, x, y); a2 = _mm256_fmadd_ps(a2, x, y);
    a3 = _mm256_fmadd_ps(a3, x, y); a4 = _mm256_fmadd_ps(a4, x, y); a5 = _mm256_fmadd_ps(a5, x, y);
    a6 = _mm256_fmadd_ps(a6, x, y); a7 = _mm256_fmadd_ps(a7, x, y); a8 = _mm256_fmadd_ps(a8, x, y);
    a9 = _mm256_fmadd_ps(a9, x, y); a10 = _mm256_fmadd_ps(a10, x, y); a11 = _mm256_fmadd_ps(a11, x, y);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  *(float*)out = _mm256_cvtss_f32(s);  // kept, so the loop is not removed
  return NULL;
}

int main(void) {
  for (int n = 1; n <= 2; ++n) {
    pthread_t threads[2];
    float sink[2];
    const double start = now();
    for (int i = 0; i < n; ++i) pthread_create(&threads[i], NULL, work, &sink[i]);
    for (int i = 0; i < n; ++i) pthread_join(threads[i], NULL);
    const double seconds = now() - start;
    printf("%d thread(s): %.2f G 8-lane FMAs/s in all\n", n, n * FMAS / seconds / 1e9);
  }
  return 0;
}
