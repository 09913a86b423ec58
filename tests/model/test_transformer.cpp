// The whole model: cached decode equals the full forward (any prefill chunking,
// across KV pages, across stage splits), loading reads only what it is asked
// for, save/load round trips, GPT-2 initialisation, and forward_backward
// against finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/hf_names.hpp"
#include "model/kv_cache.hpp"
#include "model/safetensors.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::cached_logits;
using corolla::testing::max_abs_diff;
using corolla::testing::some_ids;
namespace fs = std::filesystem;

namespace {

testing::tiny_model_options llama_gqa() {
  testing::tiny_model_options o;
  o.arch = architecture::llama;
  o.kv_heads = 2;
  return o;
}

testing::tiny_model_options llama_mha_tied() {
  testing::tiny_model_options o;
  o.arch = architecture::llama;
  o.kv_heads = 4;
  o.tied = true;
  o.seed = 2;
  return o;
}

testing::tiny_model_options gpt2() {
  testing::tiny_model_options o;
  o.arch = architecture::gpt2;
  o.kv_heads = 4;
  o.intermediate = 64;
  o.seed = 3;
  return o;
}

testing::tiny_model_options mixtral() {
  testing::tiny_model_options o;
  o.family = "MixtralForCausalLM";
  o.kv_heads = 2;
  o.experts = 4;
  o.experts_per_token = 2;
  o.seed = 4;
  return o;
}

testing::tiny_model_options qwen3_moe() {
  testing::tiny_model_options o;
  o.family = "Qwen3MoeForCausalLM";
  o.kv_heads = 2;
  o.tied = true;
  o.head_dim = 16;
  o.experts = 5;
  o.experts_per_token = 3;
  o.norm_topk_prob = false;
  o.seed = 5;
  return o;
}

void check_decode_equals_full(const testing::tiny_model_options& o) {
  testing::temp_dir_guard dir("decode");
  testing::write_tiny_model(dir.path(), o);
  Backend& be = cpu_backend();
  transformer model = transformer::load(dir.path(), be);
  const model_config& cfg = model.config();
  const auto ids = some_ids(40, cfg.vocab_size, 9);
  const std::vector<float> full = model.forward_logits(ids).to_vector();

  head h(cfg, model.head(), be);
  stage all(cfg, 0, model.blocks(), be);
  SUBCASE("whole prompt, then decode") {
    auto got = cached_logits(cfg, h, {&all}, ids, {12}, 16);
    CHECK(max_abs_diff(got, full) < 1e-4);
  }
  SUBCASE("token by token from the start") {
    auto got = cached_logits(cfg, h, {&all}, ids, {}, 16);
    CHECK(max_abs_diff(got, full) < 1e-4);
  }
  SUBCASE("chunked prefill across several small pages") {
    auto got = cached_logits(cfg, h, {&all}, ids, {3, 5, 1, 7, 9}, 4);
    CHECK(max_abs_diff(got, full) < 1e-4);
  }
  SUBCASE("two stages, each with its own cache") {
    std::vector<param_set> first(model.blocks().begin(), model.blocks().begin() + 1);
    std::vector<param_set> rest(model.blocks().begin() + 1, model.blocks().end());
    stage s0(cfg, 0, first, be), s1(cfg, 1, rest, be);
    auto got = cached_logits(cfg, h, {&s0, &s1}, ids, {6, 6}, 8);
    CHECK(max_abs_diff(got, full) < 1e-4);
  }
}

/// Rewrites dir/model.safetensors with `edit` applied to the tensors.
void rewrite_weights(const fs::path& dir,
                     const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  auto all = testing::read_all_f32(dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  checkpoint ck = checkpoint::open(dir);
  for (auto& [name, values] : all)
    tensors.emplace_back(name, Tensor::from_f32(values, ck.info(name).shape));
  edit(tensors);
  fs::remove(dir / "model.safetensors");
  write_safetensors(dir / "model.safetensors", tensors);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  return "(no model_error)";
}

}  // namespace

TEST_CASE("decode with cache equals full forward (llama GQA untied)") {
  check_decode_equals_full(llama_gqa());
}

TEST_CASE("decode with cache equals full forward (llama MHA tied)") {
  check_decode_equals_full(llama_mha_tied());
}

TEST_CASE("decode with cache equals full forward (gpt2)") { check_decode_equals_full(gpt2()); }

TEST_CASE("decode with cache equals full forward (mixtral: top-2 of 4 experts)") {
  check_decode_equals_full(mixtral());
}

TEST_CASE("decode with cache equals full forward (qwen3-moe: top-3 of 5 experts, not renormalised, tied)") {
  check_decode_equals_full(qwen3_moe());
}

TEST_CASE("a stage loads only its own blocks, the head only its tensors") {
  for (auto o : {llama_gqa(), gpt2()}) {
    testing::temp_dir_guard dir("partial");
    testing::write_tiny_model(dir.path(), o);
    // Drop every tensor of block 1.
    rewrite_weights(dir.path(), [](auto& tensors) {
      std::erase_if(tensors, [](const auto& t) {
        return t.first.find("layers.1.") != std::string::npos || t.first.find("h.1.") == 0;
      });
    });
    const model_config cfg = load_config(dir.path());
    checkpoint ck = checkpoint::open(dir.path());
    Backend& be = cpu_backend();
    CHECK_NOTHROW(stage::load(ck, cfg, 0, 1, be));
    CHECK_NOTHROW(head::load(ck, cfg, be));

    const std::string err = error_of([&] { stage::load(ck, cfg, 1, 2, be); });
    INFO(err);
    CHECK(err.find(o.arch == architecture::llama ? "model.layers.1." : "h.1.") != std::string::npos);
    CHECK(err.find("missing") != std::string::npos);
  }
}

TEST_CASE("a stage's load reports each block as it is read") {
  testing::tiny_model_options o = llama_gqa();
  o.layers = 4;
  testing::temp_dir_guard dir("progress");
  testing::write_tiny_model(dir.path(), o);
  const model_config cfg = load_config(dir.path());
  std::vector<std::pair<int, int>> progress;
  stage s = stage::load(checkpoint::open(dir.path()), cfg, 1, 4, cpu_backend(),
                        [&](int done, int total) { progress.emplace_back(done, total); });
  CHECK(s.size() == 3);
  CHECK(progress == std::vector<std::pair<int, int>>{{1, 3}, {2, 3}, {3, 3}});
}

TEST_CASE("a tensor of the wrong shape is named with its file") {
  testing::temp_dir_guard dir("shape");
  testing::write_tiny_model(dir.path(), gpt2());
  rewrite_weights(dir.path(), [](auto& tensors) {
    for (auto& [name, t] : tensors)
      if (name.find("h.0.mlp.c_fc.weight") != std::string::npos) t = Tensor::zeros({32, 63});
  });
  const std::string err = error_of([&] { transformer::load(dir.path(), cpu_backend()); });
  INFO(err);
  CHECK(err.find("h.0.mlp.c_fc.weight") != std::string::npos);
  CHECK(err.find("[32, 63]") != std::string::npos);
  CHECK(err.find("model.safetensors") != std::string::npos);
}

TEST_CASE("gpt2 loads with the transformer. prefix and attention buffers present") {
  testing::temp_dir_guard dir("prefix");
  testing::write_tiny_model(dir.path(), gpt2());
  transformer plain = transformer::load(dir.path(), cpu_backend());
  rewrite_weights(dir.path(), [](auto& tensors) {
    for (auto& [name, t] : tensors) name = "transformer." + name;
    tensors.emplace_back("transformer.h.0.attn.bias", Tensor::zeros({1, 1, 64, 64}));
    tensors.emplace_back("transformer.h.0.attn.masked_bias", Tensor::zeros({1}));
  });
  transformer prefixed = transformer::load(dir.path(), cpu_backend());
  const auto ids = some_ids(12, 64, 3);
  CHECK(prefixed.forward_logits(ids).to_vector() == plain.forward_logits(ids).to_vector());
}

TEST_CASE("save writes HF names and layouts that load reads back exactly") {
  for (auto o : {llama_gqa(), llama_mha_tied(), gpt2(), mixtral(), qwen3_moe()}) {
    testing::temp_dir_guard src("save-src"), dst("save-dst");
    testing::write_tiny_model(src.path(), o);
    transformer model = transformer::load(src.path(), cpu_backend());
    model.save(dst.path());
    // The saved tensors are the original ones (GPT-2 may gain "transformer.").
    auto before = testing::read_all_f32(src.path());
    auto after = testing::read_all_f32(dst.path());
    std::map<std::string, std::vector<float>> renamed;
    for (auto& [name, v] : after)
      renamed[name.rfind("transformer.", 0) == 0 && !before.count(name) ? name.substr(12) : name] = v;
    CHECK(renamed == before);
    transformer again = transformer::load(dst.path(), cpu_backend());
    CHECK(again.config().hidden_size == model.config().hidden_size);
    const auto ids = some_ids(10, o.vocab, 4);
    CHECK(again.forward_logits(ids).to_vector() == model.forward_logits(ids).to_vector());
  }
}

TEST_CASE("init is deterministic per seed with GPT-2 statistics") {
  model_config cfg = testing::tiny_config(gpt2());
  cfg.hidden_size = 64;
  cfg.head_dim = 16;
  cfg.intermediate_size = 256;
  cfg.n_layers = 4;
  Backend& be = cpu_backend();
  transformer a = transformer::init(cfg, 7, be);
  transformer b = transformer::init(cfg, 7, be);
  transformer c = transformer::init(cfg, 8, be);
  CHECK(a.head().flat().to_vector() == b.head().flat().to_vector());
  CHECK(a.blocks()[3].flat().to_vector() == b.blocks()[3].flat().to_vector());
  CHECK(a.blocks()[3].flat().to_vector() != c.blocks()[3].flat().to_vector());
  auto stddev = [](const Tensor& t) {
    auto v = t.to_vector();
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  const param_set& blk = a.blocks()[1];
  CHECK(stddev(blk.get("q.weight")) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stddev(blk.get("up.weight")) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stddev(blk.get("o.weight")) == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(stddev(blk.get("down.weight")) == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(stddev(a.head().get("embed.weight")) == doctest::Approx(0.02).epsilon(0.05));
  for (float v : blk.get("mlp_norm.weight").to_vector()) CHECK(v == 1.0f);
  for (float v : blk.get("up.bias").to_vector()) CHECK(v == 0.0f);
  for (float v : a.head().get("final_norm.bias").to_vector()) CHECK(v == 0.0f);
}

TEST_CASE("forward_backward matches finite differences of the mean loss") {
  for (auto o : {llama_gqa(), llama_mha_tied(), gpt2()}) {
    o.hidden = 16;
    o.intermediate = 24;
    o.vocab = 32;
    testing::temp_dir_guard dir("fb");
    testing::write_tiny_model(dir.path(), o);
    transformer model = transformer::load(dir.path(), cpu_backend());
    const int B = 2, T = 6;
    auto ids = some_ids(B * T, o.vocab, 1);
    auto targets = some_ids(B * T, o.vocab, 2);
    model.zero_grads();
    const float loss = model.forward_backward(ids, targets, B, T, 3.0f);
    CHECK(loss == doctest::Approx(model.forward_loss(ids, targets, B, T)).epsilon(1e-6));
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const double h = 1e-3;
    for (param_group g : model.groups()) {
      Tensor& p = g.params->flat();
      std::vector<float> d(static_cast<std::size_t>(p.numel()));
      for (auto& x : d) x = normal(rng);
      const std::vector<float> saved = p.to_vector();
      float* pv = p.data<float>();
      auto at = [&](double step) {
        for (std::size_t i = 0; i < d.size(); ++i) pv[i] = saved[i] + static_cast<float>(step) * d[i];
        return static_cast<double>(model.forward_loss(ids, targets, B, T));
      };
      const double numeric = 3.0 * (at(h) - at(-h)) / (2 * h);
      at(0);
      double analytic = 0;
      const auto grad = g.grads->flat().to_vector();
      for (std::size_t i = 0; i < d.size(); ++i) analytic += static_cast<double>(grad[i]) * d[i];
      INFO("group of " << p.numel() << ": analytic " << analytic << ", numeric " << numeric);
      CHECK(std::abs(analytic - numeric) <= 5e-3 * std::max(1.0, std::abs(analytic)));
    }
  }
}

TEST_CASE("forward_backward accumulates gradients, scaled") {
  testing::temp_dir_guard dir("accum");
  testing::write_tiny_model(dir.path(), gpt2());
  transformer model = transformer::load(dir.path(), cpu_backend());
  auto ids = some_ids(8, 64, 1), targets = some_ids(8, 64, 2);
  model.zero_grads();
  model.forward_backward(ids, targets, 2, 4, 1.0f);
  std::vector<std::vector<float>> once;
  for (auto g : model.groups()) once.push_back(g.grads->flat().to_vector());
  model.zero_grads();
  model.forward_backward(ids, targets, 2, 4, 0.5f);
  model.forward_backward(ids, targets, 2, 4, 0.5f);
  auto groups = model.groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    auto twice = groups[i].grads->flat().to_vector();
    double worst = 0;
    for (std::size_t j = 0; j < twice.size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(twice[j] - once[i][j])));
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("bad batches are clear errors") {
  testing::temp_dir_guard dir("badbatch");
  testing::write_tiny_model(dir.path(), llama_gqa());
  transformer model = transformer::load(dir.path(), cpu_backend());
  std::vector<std::int32_t> ids{1, 2, 64, 3}, targets{1, 2, 3, 4};
  CHECK(error_of([&] { model.forward_loss(ids, targets, 1, 4); }) ==
        "token id 64 is outside the vocabulary (64 tokens)");
  auto long_ids = some_ids(65, 64, 1);
  CHECK(error_of([&] { model.forward_logits(long_ids); }) ==
        "sequence length 65 exceeds the model context of 64");
}
