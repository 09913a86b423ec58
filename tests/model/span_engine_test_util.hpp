// tests/model/span_engine_test_util.hpp — what the span engine tests share:
// tiny llama and GPT-2 options, a tiny model on disk with the client's head
// loaded, and short checks of span_expected results (seeded token ids come
// from cached_logits.hpp).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/head.hpp"
#include "model/safetensors.hpp"
#include "model/sampler.hpp"
#include "model/span_engine.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla::testing {

inline tiny_model_options llama_opts(int layers = 2) {
  tiny_model_options o;
  o.arch = architecture::llama;
  o.kv_heads = 2;
  o.layers = layers;
  return o;
}

inline tiny_model_options gpt2_opts(int layers = 2) {
  tiny_model_options o;
  o.arch = architecture::gpt2;
  o.kv_heads = o.heads;
  o.intermediate = 64;
  o.layers = layers;
  o.seed = 3;
  return o;
}

/// A tiny model on disk with its head loaded (the client's side).
struct model_dir {
  temp_dir_guard dir{"span-engine"};
  model_config cfg;
  checkpoint ck;
  head client;

  explicit model_dir(const tiny_model_options& o)
      : cfg(write(dir.path(), o)), ck(checkpoint::open(dir.path())),
        client(head::load(ck, cfg, cpu_backend())) {}

  static model_config write(const std::filesystem::path& p, const tiny_model_options& o) {
    write_tiny_model(p, o);
    return load_config(p);
  }

  span_engine engine(int first, int last, std::int64_t cache_tokens = 4096,
                     const span_engine_options& opts = {}) {
    return span_engine::load(ck, cfg, first, last, cpu_backend(), cache_tokens, opts);
  }

  /// Embeddings of `ids` at positions start.. [n, D].
  Tensor embed(const std::vector<std::int32_t>& ids, std::int64_t start) {
    const auto n = static_cast<std::int64_t>(ids.size());
    std::vector<std::int32_t> pos;
    for (std::int64_t i = 0; i < n; ++i) pos.push_back(static_cast<std::int32_t>(start + i));
    Tensor x = Tensor::empty({n, cfg.hidden_size});
    client.embed(Tensor::from_i32(ids, {n}), Tensor::from_i32(pos, {n}), x);
    return x;
  }

  /// Greedy next token from the last row of the span chain's output.
  std::int32_t next_token(const Tensor& hidden) {
    Tensor last = hidden.slice(hidden.dim(0) - 1, hidden.dim(0));
    Tensor logits = Tensor::empty({1, cfg.vocab_size});
    client.logits(last, logits, nullptr);
    return argmax({logits.data<float>(), static_cast<std::size_t>(cfg.vocab_size)});
  }
};

inline bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

template <class T>
std::string error_of(const span_expected<T>& r) {
  return r ? std::string("(no error)") : r.error().message;
}

template <class T>
span_errc code_of(const span_expected<T>& r) {
  REQUIRE_FALSE(r.has_value());
  return r.error().code;
}

}  // namespace corolla::testing
