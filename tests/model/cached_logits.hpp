// tests/model/cached_logits.hpp — what the model tests compare decoding
// with: seeded token ids, and the logits of every position computed through
// head + stage(s) with a KV cache (prefill chunks, then one token at a time).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/head.hpp"
#include "model/kv_cache.hpp"
#include "model/stage.hpp"

namespace corolla::testing {

inline std::vector<std::int32_t> some_ids(int n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<std::int32_t>(rng() % vocab));
  return ids;
}

/// Runs `ids` through head + stage with a KV cache of `kv_type` elements:
/// prefill in the given chunks, then the rest one token at a time. Returns
/// the logits of every position [n, V], as the full forward would.
inline std::vector<float> cached_logits(const model_config& cfg, head& h,
                                 std::vector<stage*> stages, const std::vector<std::int32_t>& ids,
                                 const std::vector<int>& chunks, int page_tokens, dtype kv_type = dtype::f32) {
  const int V = cfg.vocab_size, D = cfg.hidden_size;
  std::vector<std::unique_ptr<kv_sequence>> kv;
  for (stage* s : stages) {
    auto pool = std::make_shared<kv_pool>(1 << 22, s->size(), cfg.n_kv_heads, cfg.head_dim,
                                          page_tokens, &s->backend(), kv_type);
    kv.push_back(std::make_unique<kv_sequence>(pool));
  }
  std::vector<float> out;
  std::size_t pos = 0, chunk = 0;
  while (pos < ids.size()) {
    const std::size_t n = chunk < chunks.size() ? static_cast<std::size_t>(chunks[chunk++]) : 1;
    const auto T = static_cast<std::int64_t>(n);
    std::vector<std::int32_t> id(ids.begin() + static_cast<std::ptrdiff_t>(pos),
                                 ids.begin() + static_cast<std::ptrdiff_t>(pos + n));
    std::vector<std::int32_t> p;
    for (std::size_t i = 0; i < n; ++i) p.push_back(static_cast<std::int32_t>(pos + i));
    Tensor x = Tensor::empty({T, D});
    h.embed(Tensor::from_i32(id, {T}), Tensor::from_i32(p, {T}), x);
    for (std::size_t s = 0; s < stages.size(); ++s) {
      REQUIRE(kv[s]->reserve(static_cast<std::int64_t>(pos + n)));
      stages[s]->forward_cached(x, *kv[s], static_cast<std::int64_t>(pos), x);
    }
    Tensor logits = Tensor::empty({T, V});
    h.logits(x, logits, nullptr);
    auto v = logits.to_vector();
    out.insert(out.end(), v.begin(), v.end());
    pos += n;
  }
  return out;
}

}  // namespace corolla::testing
