// The FFI side of the decode-attention kernel (decode_attention_avx2.cc), apart from its arithmetic: its arguments
// and how a query row's tokens, keys and values are found in them, the checks on them, the split of a call into
// work items over XLA's intra-op pool (one per query row, kv head and run of tokens; an item's arithmetic never
// depends on which thread runs it or on the other items), and its binding.
//
// The cache arguments are every layer's cache, [L, Bc, S, K, Dh], and the ``layer`` attribute picks the one read:
// a call on the decode loop's whole cache buffer then reads it where it lies, where a per-layer slice would be
// copied into a buffer of its own on every call (a whole cache's worth of copies per step). The call also returns
// both caches, aliased to those arguments and untouched: a caller that hands them from layer to layer and writes
// the step's new keys into the last call's caches makes its write follow every read, so XLA updates the cache in
// place instead of copying all of it first (nothing else orders the last layers' reads before the write).
#pragma once

#include <cstdint>
#include <string>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace jf_cpu {

template <typename E>
struct AttentionArgs {
  const E *q, *k_new, *v_new, *cache_k, *cache_v;  // cache_k, cache_v: the layer read, [Bc, S, K, Dh]
  const int32_t *valid, *lengths;
  float* out;
  int64_t B, T, H, K, Dh, Bc, S;

  // q[((t - t0) * G + g) * Dh + d] = query (b, t, head kh * G + g)'s element d as float32, for t in [t0, t1).
  void LoadQueries(int64_t b, int64_t kh, int64_t t0, int64_t t1, float* q_out) const {
    const int64_t G = H / K;
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < Dh; ++d)
          q_out[((t - t0) * G + g) * Dh + d] = ToF32(q[((b * T + t) * H + kh * G + g) * Dh + d]);
  }

  // The last position any valid query among tokens [t0, t1) of row b sees (-1: none), its cache holding len.
  int64_t LastVisible(int64_t b, int64_t t0, int64_t t1, int64_t len) const {
    int64_t last = -1;
    for (int64_t t = t0; t < t1; ++t)
      if (valid[b * T + t]) last = len + t;
    return last;
  }

  // The key and value rows of key j on kv head kh for query row b (cache row cb of the layer read, holding len):
  // the cache's for j < len, the row's own new token j - len's when it is valid, none (nullptr) otherwise.
  void KeyValue(int64_t b, int64_t cb, int64_t kh, int64_t len, int64_t j, const E** ks, const E** vs) const {
    *ks = *vs = nullptr;
    if (j < len) {
      *ks = cache_k + ((cb * S + j) * K + kh) * Dh;
      *vs = cache_v + ((cb * S + j) * K + kh) * Dh;
    } else if (j - len < T && valid[b * T + (j - len)]) {
      *ks = k_new + ((b * T + (j - len)) * K + kh) * Dh;
      *vs = v_new + ((b * T + (j - len)) * K + kh) * Dh;
    }
  }
};

// Checks the buffers and runs ``item(args, b, kh, t0, t1)`` for the tokens [t0, t1) of query row b on kv head kh,
// in runs of ``tokens_per_item`` tokens.
template <xla::ffi::DataType DT, typename E, typename Item>
xla::ffi::Error RunAttention(const char* name, int64_t tokens_per_item, xla::ffi::ThreadPool pool,
                             xla::ffi::Buffer<DT> q, xla::ffi::Buffer<DT> k_new, xla::ffi::Buffer<DT> v_new,
                             xla::ffi::Buffer<xla::ffi::S32> valid, xla::ffi::Buffer<DT> cache_k,
                             xla::ffi::Buffer<DT> cache_v, xla::ffi::Buffer<xla::ffi::S32> lengths,
                             xla::ffi::ResultBuffer<xla::ffi::F32> out, int64_t layer, Item item) {
  auto qd = q.dimensions(), cd = cache_k.dimensions();
  if (qd.size() != 4 || cd.size() != 5 || k_new.dimensions().size() != 4) {
    return xla::ffi::Error::InvalidArgument(std::string(name) + ": q and k_new must be rank 4, the caches rank 5");
  }
  if (layer < 0 || layer >= cd[0]) {
    return xla::ffi::Error::InvalidArgument(std::string(name) + ": layer " + std::to_string(layer) +
                                            " is not one of the cache's " + std::to_string(cd[0]));
  }
  const int64_t layer_offset = layer * cd[1] * cd[2] * cd[3] * cd[4];
  AttentionArgs<E> a{reinterpret_cast<const E*>(q.typed_data()), reinterpret_cast<const E*>(k_new.typed_data()),
                     reinterpret_cast<const E*>(v_new.typed_data()),
                     reinterpret_cast<const E*>(cache_k.typed_data()) + layer_offset,
                     reinterpret_cast<const E*>(cache_v.typed_data()) + layer_offset, valid.typed_data(),
                     lengths.typed_data(), out->typed_data(), qd[0], qd[1], qd[2], cd[3], qd[3], cd[1], cd[2]};
  if (a.Dh % 32 || a.H % a.K || a.Bc < 1 || a.B % a.Bc) {
    return xla::ffi::Error::InvalidArgument(std::string(name) + ": head_dim must be a multiple of 32, heads a "
                                            "multiple of kv heads, and the query rows a multiple of the cache rows");
  }
  const int64_t chunks = (a.T + tokens_per_item - 1) / tokens_per_item;
  RunParts(pool, a.B * a.K * chunks, [a, chunks, tokens_per_item, item](int64_t i) {
    const int64_t c = i % chunks, bk = i / chunks;
    const int64_t t0 = c * tokens_per_item, t1 = t0 + tokens_per_item < a.T ? t0 + tokens_per_item : a.T;
    item(a, bk / a.K, bk % a.K, t0, t1);
  });
  return xla::ffi::Error::Success();
}

}  // namespace jf_cpu

// The handler signature of a decode-attention kernel taking its buffers in dtype DT.
#define JF_ATTENTION_SIGNATURE(DT)                                                                              \
  xla::ffi::ThreadPool pool, xla::ffi::Buffer<DT> q, xla::ffi::Buffer<DT> k_new, xla::ffi::Buffer<DT> v_new,   \
      xla::ffi::Buffer<xla::ffi::S32> valid, xla::ffi::Buffer<DT> cache_k, xla::ffi::Buffer<DT> cache_v,       \
      xla::ffi::Buffer<xla::ffi::S32> lengths, xla::ffi::ResultBuffer<xla::ffi::F32> out,                     \
      xla::ffi::ResultBuffer<DT> /*cache_k, passed through*/, xla::ffi::ResultBuffer<DT> /*cache_v*/, int64_t layer
#define JF_ATTENTION_ARGUMENTS pool, q, k_new, v_new, valid, cache_k, cache_v, lengths, out, layer

#define JF_ATTENTION_BINDING(DT)                 \
  xla::ffi::Ffi::Bind()                          \
      .Ctx<xla::ffi::ThreadPool>()               \
      .Arg<xla::ffi::Buffer<DT>>()               \
      .Arg<xla::ffi::Buffer<DT>>()               \
      .Arg<xla::ffi::Buffer<DT>>()               \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>()    \
      .Arg<xla::ffi::Buffer<DT>>()               \
      .Arg<xla::ffi::Buffer<DT>>()               \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>()    \
      .Ret<xla::ffi::Buffer<xla::ffi::F32>>()    \
      .Ret<xla::ffi::Buffer<DT>>()               \
      .Ret<xla::ffi::Buffer<DT>>()               \
      .Attr<int64_t>("layer")
