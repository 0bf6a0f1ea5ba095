// The KV-cache write of a decode step as an XLA FFI custom call: every layer's block of new keys (or values) copied
// into the cache at each row's committed length, in place.
//
// Why a kernel for a copy: XLA:CPU computes a bfloat16 (or float16) dynamic-update-slice in float32 ("float
// normalization"), as one fusion over every element of the [L, B, S, K, Dh] cache: convert, update, convert back.
// The buffer is reused, but each step reads and writes the whole cache, which after a long prompt costs more than
// the step's attention. This call copies only the T new slots of each layer and row; its result is aliased to the
// cache argument, so XLA hands it the cache's own buffer.
//
// Arguments: cache [L, B, S, K, Dh] (any element type), block [L, B, T, K, Dh] of the same type, lengths [B] int32.
// The result is the cache with block[l, b] at slots start_b ... start_b + T - 1 of cache[l, b], where start_b is
// lengths[b] (plus S when negative) clamped to [0, S - T]: what jax's dynamic_update_slice computes, its twin
// (jf_jax.model.kv_cache).
#include <cstdint>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error CacheWriteImpl(ffi::AnyBuffer cache, ffi::AnyBuffer block, ffi::Buffer<ffi::S32> lengths,
                          ffi::Result<ffi::AnyBuffer> out) {
  auto cd = cache.dimensions(), bd = block.dimensions();
  if (cd.size() != 5 || bd.size() != 5 || lengths.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument("cache_write: the cache and the block must be rank 5, lengths rank 1");
  }
  const int64_t L = cd[0], B = cd[1], S = cd[2], T = bd[2], row = cd[3] * cd[4];
  if (block.element_type() != cache.element_type() || out->element_type() != cache.element_type() ||
      bd[0] != L || bd[1] != B || bd[3] != cd[3] || bd[4] != cd[4] || T > S || lengths.dimensions()[0] != B) {
    return ffi::Error::InvalidArgument(
        "cache_write: expected a cache [L, B, S, K, Dh], a block [L, B, T <= S, K, Dh] of its element type and "
        "lengths [B]");
  }
  const size_t width = ffi::ByteWidth(cache.element_type());
  char* dst = static_cast<char*>(out->untyped_data());
  const char* src = static_cast<const char*>(block.untyped_data());
  if (dst != cache.untyped_data()) std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const size_t span = static_cast<size_t>(T * row) * width;  // one layer's and row's T slots, contiguous
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = lengths.typed_data()[b];
    if (start < 0) start += S;  // as jax's dynamic_update_slice reads a negative index
    start = start < 0 ? 0 : (start > S - T ? S - T : start);
    for (int64_t l = 0; l < L; ++l) {
      std::memcpy(dst + static_cast<size_t>(((l * B + b) * S + start) * row) * width,
                  src + static_cast<size_t>((l * B + b) * T * row) * width, span);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JfCacheWrite, CacheWriteImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());
