// Splitting a kernel call's work over XLA's intra-op thread pool (shared by every kernel of cpu_kernels).
//
// Parts are claimed from a counter by the calling thread and by helpers scheduled on the pool; the caller
// waits only for parts already being computed, so a helper that starts late (or never, when the pool is busy)
// cannot stall it. The shared state outlives any late helper. Which thread computes a part never changes its
// arithmetic: every part is a fixed computation of its own outputs.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace jf_cpu {

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

}  // namespace jf_cpu
