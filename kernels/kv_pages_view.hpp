// kernels/kv_pages_view.hpp — one sequence's paged key/value cache as the
// attention ops read it (Backend::attention_cached, rope_store_kv_pages):
// the pages' addresses (on the host, and on the device where a kv_sequence
// keeps its tables there) and where a position's rows are.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "kernels/tensor.hpp"

namespace corolla {

/// A read-only view of one layer's paged key/value cache for one sequence.
/// Page p holds tokens [p*page_tokens, (p+1)*page_tokens) as rows of
/// Hkv*Dh elements of `type` (keys from k_pages[p], values from v_pages[p]).
struct kv_pages_view {
  std::span<const void* const> k_pages;
  std::span<const void* const> v_pages;
  std::int64_t page_tokens = 0;
  std::int64_t length = 0;  ///< tokens valid in the cache
  /// The pages' element type: f32, or bf16/f16 (half the cache memory; the
  /// attention widens them and computes in f32).
  dtype type = dtype::f32;
  /// The same page pointers already in device memory (a kv_sequence on a
  /// device keeps its tables there, written when it takes pages), so a
  /// device backend's attention uploads nothing: key page p's pointer is
  /// device_pages[key_entry + p * page_stride], its value page's the entry
  /// after it. Null: the backend copies k_pages and v_pages itself.
  const void* const* device_pages = nullptr;
  std::int64_t page_stride = 0;
  std::int64_t key_entry = 0;
  /// The device whose memory holds device_pages.
  device pages_device{};
};

/// Where the key and value rows of position `pos` of `cache` are (`width`
/// elements of cache.type each), from its host arrays. Throws tensor_error
/// naming `what` for a position the cache does not hold. Inline: backends
/// link it without the device registry in kernels/backend.cpp.
inline std::pair<void*, void*> kv_page_row(const kv_pages_view& cache, std::int64_t pos, std::int64_t width,
                                           const char* what) {
  if (cache.page_tokens <= 0 || pos < 0 || pos >= cache.length ||
      pos / cache.page_tokens >= static_cast<std::int64_t>(std::min(cache.k_pages.size(), cache.v_pages.size())))
    throw tensor_error(std::string(what) + ": position " + std::to_string(pos) + " is not held by a cache of " +
                       std::to_string(cache.length) + " tokens in " + std::to_string(cache.k_pages.size()) +
                       " pages of " + std::to_string(cache.page_tokens));
  const auto page = static_cast<std::size_t>(pos / cache.page_tokens);
  if (cache.k_pages[page] == nullptr || cache.v_pages[page] == nullptr)
    throw tensor_error(std::string(what) + ": the page of position " + std::to_string(pos) + " is null");
  const std::size_t offset = static_cast<std::size_t>(pos % cache.page_tokens * width) * dtype_size(cache.type);
  auto at = [offset](const void* page_base) {
    return static_cast<void*>(const_cast<std::byte*>(static_cast<const std::byte*>(page_base)) + offset);
  };
  return {at(cache.k_pages[page]), at(cache.v_pages[page])};
}

}  // namespace corolla
