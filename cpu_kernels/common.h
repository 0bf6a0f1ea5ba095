// What every kernel of cpu_kernels shares: bf16 -> float32 reads, and splitting a call's work over XLA's intra-op
// thread pool.
//
// Parts are claimed from a counter by the calling thread and by helpers scheduled on the pool; the caller
// waits only for parts already being computed, so a helper that starts late (or never, when the pool is busy)
// cannot stall it. The shared state outlives any late helper. Which thread computes a part never changes its
// arithmetic: every part is a fixed computation of its own outputs.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace jf_cpu {

// A bfloat16 (its bits) or float32 value as float32, exactly.
inline float ToF32(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline float ToF32(float v) { return v; }

template <typename Part>
void RunParts(xla::ffi::ThreadPool& pool, int64_t parts, Part part) {
  struct State {
    Part part;
    int64_t parts;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    void Drain() {
      for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
        part(p);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  const int64_t threads = pool.num_threads() > 0 ? pool.num_threads() : 1;
  if (threads == 1 || parts == 1) {
    for (int64_t p = 0; p < parts; ++p) part(p);
    return;
  }
  std::shared_ptr<State> state(new State{part, parts});
  for (int64_t i = 1; i < threads && i < parts; ++i) pool.Schedule([state] { state->Drain(); });
  state->Drain();
  while (state->done.load(std::memory_order_acquire) < parts) _mm_pause();
}

// The column tiles [0, tiles) of a small-M GEMM of an [M, K] x by a weight [K, 16 * tiles]: about four parts
// per thread, each an even number of tiles (the AVX-512 GEMMs compute tiles in pairs); everything inline when the
// pool has one thread, the call is small or one part would hold every tile. A call's cost is reading its weight
// (which does not shrink with M: a one-row step streams the whole weight) plus its arithmetic (which grows with M),
// so "small" counts both, as tiles * K * (M + 8) < 2^17: a 576 x 192 weight runs inline at one row, a 576 x 576
// one is split. The weighting was measured with the AVX-512 GEMM; the AVX2 one, with more arithmetic per row,
// splits at least as readily. ``run_tiles(t0, t1)`` computes [t0, t1).
template <typename RunTiles>
void RunColumnTiles(xla::ffi::ThreadPool& pool, int64_t tiles, int64_t K, int64_t M, RunTiles run_tiles) {
  const int64_t threads = pool.num_threads() > 0 ? pool.num_threads() : 1;
  int64_t tiles_per_part = (tiles + 4 * threads - 1) / (4 * threads);
  tiles_per_part += tiles_per_part % 2;
  if (threads == 1 || tiles * K * (M + 8) < (int64_t{1} << 17) || tiles_per_part >= tiles) {
    run_tiles(int64_t{0}, tiles);
    return;
  }
  RunParts(pool, (tiles + tiles_per_part - 1) / tiles_per_part, [run_tiles, tiles, tiles_per_part](int64_t p) {
    const int64_t t0 = p * tiles_per_part;
    run_tiles(t0, t0 + tiles_per_part < tiles ? t0 + tiles_per_part : tiles);
  });
}

}  // namespace jf_cpu
