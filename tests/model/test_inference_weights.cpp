// Inference with bf16, int8 or nf4 copies of the linear weights
// (generator's `weights`, stage/head use_inference_weights): generation
// equals, token for token, the f32 model whose linear weights were rounded
// to bf16 (or quantised to int8 per output channel, or to nf4 in blocks of
// 64 with an int8 LM head, and back) first; the logits agree to f32
// summation order; the f32 parameters and the training path stay untouched.
// Mixtures of experts (Mixtral, Qwen3-MoE) convert every expert's matrices;
// their routers stay f32.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/kv_cache.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::max_abs_diff;
using corolla::testing::some_ids;

namespace {

/// Rounds `t` (f32, host, [rows, cols]) in place to what a weight of
/// format `f` holds: the nearest bf16 values, or int8 quantised per row (as
/// Backend::quantize_int8 with one block per row) or nf4
/// (Backend::quantize_nf4), and dequantised.
void round_to(Tensor t, weight_format f) {
  if (f == weight_format::bf16) {
    t.copy_from(t.to(dtype::bf16).to(dtype::f32));
    return;
  }
  if (f == weight_format::nf4) {
    const quantized_weight q = quantize_rows(cpu_backend(), t, weight_format::nf4);
    cpu_backend().dequantize_nf4(q.q, q.scale, t);
    return;
  }
  const std::int64_t n = t.numel(), cols = t.dim(1);
  Tensor q = Tensor::empty({n}, dtype::i8), scale = Tensor::empty({n / cols});
  Tensor flat = t.view({n});
  cpu_backend().quantize_int8(flat, static_cast<int>(cols), q, scale);
  cpu_backend().dequantize_int8(q, scale, static_cast<int>(cols), flat);
}

/// The LM head's format for blocks of format `f` (head::lm_head_format).
weight_format head_format(weight_format f) { return is_quantized(f) ? weight_format::int8 : f; }

/// What the inference path converts: every block matrix but a mixture of
/// experts' router, and the LM head.
void round_linear_weights(transformer& m, weight_format f) {
  for (param_set& p : m.blocks())
    for (const param_entry& e : p.entries())
      if (stored_in_weight_format(e.name, e.shape)) round_to(p.get(e.name), f);
  const bool tied = m.config().tie_embeddings;
  round_to(m.head().get(tied ? "embed.weight" : "lm_head.weight"), head_format(f));
}

/// A model family of the tests: an architecture, and for llama the HF family.
struct family {
  architecture arch;
  const char* name;  ///< tiny_model_options::family (llama only)
};

/// Llama, GPT-2 and the three mixtures of experts.
constexpr family kFamilies[] = {{architecture::llama, "LlamaForCausalLM"},
                                {architecture::gpt2, "GPT2LMHeadModel"},
                                {architecture::llama, "MixtralForCausalLM"},
                                {architecture::llama, "Qwen3MoeForCausalLM"},
                                {architecture::llama, "Qwen2MoeForCausalLM"}};

/// Every family with every non-f32 format.
std::vector<std::pair<family, weight_format>> cases() {
  std::vector<std::pair<family, weight_format>> out;
  for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4})
    for (const family& a : kFamilies) out.emplace_back(a, f);
  return out;
}

testing::tiny_model_options options_for(const family& f) {
  testing::tiny_model_options o = testing::tiny_options_for(f.arch);
  if (f.arch == architecture::llama) o.family = f.name;
  if (o.family == "Qwen3MoeForCausalLM") {
    // Top-3 of 5 experts, not renormalised, tied (its LM head is the int8 embedding).
    o.experts = 5;
    o.experts_per_token = 3;
    o.norm_topk_prob = false;
    o.tied = true;
    o.head_dim = 16;
  }
  return o;
}

/// Logits of every position [n, V]: the first `prefill` ids at once, then
/// one at a time, through head + stage with a KV cache.
std::vector<float> cached_logits(head& h, stage& s, const std::vector<std::int32_t>& ids, std::size_t prefill) {
  return testing::cached_logits(h.config(), h, {&s}, ids, {static_cast<int>(prefill)}, 16);
}

}  // namespace

TEST_CASE("bf16, int8 and nf4 weights generate what the f32 model with rounded weights generates") {
  for (const auto& [fam, type] : cases()) {
    const std::string family_name = fam.name, format = weight_format_name(type);
    CAPTURE(family_name);
    CAPTURE(format);
    testing::temp_dir_guard dir("bf16-weights");
    testing::write_tiny_model(dir.path(), options_for(fam));
    Backend& be = cpu_backend();
    transformer model = transformer::load(dir.path(), be);
    transformer rounded = transformer::load(dir.path(), be);
    if (model.config().tie_embeddings) {
      // One tensor is both the embedding (read in f32) and the LM head
      // (read as bf16): make it bf16-exact in both models, so the rounded
      // reference embeds what the bf16 model embeds.
      round_to(model.head().get("embed.weight"), head_format(type));
    }
    round_linear_weights(rounded, type);
    const std::vector<float> block0_before = model.blocks()[0].flat().to_vector();

    generator gen16(model, 0, type);
    generator gen_ref(rounded, 0, weight_format::f32);
    CHECK(gen16.weights() == type);
    CHECK(gen_ref.weights() == weight_format::f32);
    generation_params p;
    p.max_new_tokens = 24;
    p.ignore_eos = true;
    const auto prompt = some_ids(20, model.config().vocab_size, 5);
    const auto got = gen16.generate(prompt, p).tokens;
    CHECK(got.size() == 24);
    CHECK(got == gen_ref.generate(prompt, p).tokens);
    p.prefill_chunk = 3;  // several prefill chunks take the same path
    CHECK(gen16.generate(prompt, p).tokens == got);

    // The copies are made next to the f32 parameters, which stay as loaded.
    CHECK(model.blocks()[0].flat().to_vector() == block0_before);
  }
}

TEST_CASE("bf16-, int8- and nf4-weight logits agree with the rounded f32 model and differ from the unrounded") {
  for (const auto& [fam, type] : cases()) {
    const std::string family_name = fam.name, format = weight_format_name(type);
    CAPTURE(family_name);
    CAPTURE(format);
    testing::temp_dir_guard dir("bf16-logits");
    testing::write_tiny_model(dir.path(), options_for(fam));
    Backend& be = cpu_backend();
    transformer model = transformer::load(dir.path(), be);
    transformer rounded = transformer::load(dir.path(), be);
    if (model.config().tie_embeddings) round_to(model.head().get("embed.weight"), head_format(type));
    const auto ids = some_ids(40, model.config().vocab_size, 7);
    const std::vector<float> unrounded = model.forward_logits(ids).to_vector();
    round_linear_weights(rounded, type);
    const std::vector<float> want = rounded.forward_logits(ids).to_vector();

    const model_config& cfg = model.config();
    head h(cfg, model.head(), be);
    stage s(cfg, 0, model.blocks(), be);
    h.use_inference_weights(type);
    s.use_inference_weights(type);
    CHECK(h.inference_format() == type);
    CHECK(h.lm_head_format() == head_format(type));
    CHECK(s.inference_format() == type);
    // a 24-row prefill (the blocked many-row kernel), then 16 single rows
    const auto got = cached_logits(h, s, ids, 24);
    CHECK(max_abs_diff(got, want) < 1e-4);
    // the test can tell: rounding moves the logits far more than that
    CHECK(max_abs_diff(got, unrounded) > 1e-3);

    // The training path keeps the f32 parameters: the same stage's full
    // forward equals the unrounded model's.
    CHECK(max_abs_diff(model.forward_logits(ids).to_vector(), unrounded) == 0.0);
    // f32 drops the copies again
    s.use_inference_weights(weight_format::f32);
    h.use_inference_weights(weight_format::f32);
    CHECK(max_abs_diff(cached_logits(h, s, ids, 24), unrounded) < 1e-4);
  }
}

TEST_CASE("weight formats by name: f32, bf16, int8 (i8 on the wire) and nf4, nothing else") {
  for (weight_format f : {weight_format::f32, weight_format::bf16, weight_format::int8, weight_format::nf4})
    CHECK(weight_format_named(weight_format_name(f)) == f);
  CHECK(weight_format_named("int8") == weight_format::int8);
  CHECK(std::string(weight_format_name(weight_format::int8)) == "i8");  // what servers announced before nf4
  for (const char* bad : {"f16", "int4", "", "NF4", "i32"}) CHECK_FALSE(weight_format_named(bad).has_value());
  CHECK(is_quantized(weight_format::nf4));
  CHECK_FALSE(is_quantized(weight_format::bf16));
}

TEST_CASE("a bf16 or f16 KV cache gives the f32 cache's logits within 16-bit rounding") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::temp_dir_guard dir("kv16");
    testing::write_tiny_model(dir.path(), testing::tiny_options_for(arch));
    transformer model = transformer::load(dir.path(), cpu_backend());
    const model_config& cfg = model.config();
    head h(cfg, model.head(), cpu_backend());
    stage s(cfg, 0, model.blocks(), cpu_backend());
    const auto ids = some_ids(40, cfg.vocab_size, 11);
    // Chunked prefill (appended rows), then decode rows (written by rope_store_kv).
    const std::vector<int> chunks = {9, 7};
    const auto want = testing::cached_logits(cfg, h, {&s}, ids, chunks, 8);
    double magnitude = 0;
    for (float x : want) magnitude = std::max(magnitude, static_cast<double>(std::abs(x)));
    // Keys and values rounded once (relative 2^-9 for bf16, 2^-12 for f16)
    // move the largest logit error by 10-12x that of the logits' size on
    // these models (Llama; GPT-2 less): bounded at 24x, and the two types'
    // errors must scale with their precision (a wrong read would not).
    double diffs[2] = {0, 0};
    int i = 0;
    for (auto [type, eps] : {std::pair{dtype::bf16, 0x1p-9}, {dtype::f16, 0x1p-12}}) {
      const std::string name = dtype_name(type);
      CAPTURE(name);
      const auto got = testing::cached_logits(cfg, h, {&s}, ids, chunks, 8, type);
      diffs[i] = max_abs_diff(got, want);
      CHECK(diffs[i] <= 24 * eps * magnitude);
      CHECK(diffs[i] > 0.0);  // the cache did hold 16-bit values
      ++i;
    }
    CHECK(diffs[0] > 3 * diffs[1]);
  }
  transformer model = [] {
    testing::temp_dir_guard dir("kv16-errors");
    testing::write_tiny_model(dir.path(), {});
    return transformer::load(dir.path(), cpu_backend());
  }();
  CHECK_THROWS_WITH_AS(generator(model, 0, weight_format::f32, dtype::i32),
                       "generator: the KV cache is f32, bf16 or f16, not i32", model_error);
  // A generator on a bf16 cache generates (its cache pages are half-size).
  generator g(model, 0, weight_format::f32, dtype::bf16);
  generation_params p;
  p.max_new_tokens = 8;
  p.ignore_eos = true;
  CHECK(g.generate(some_ids(6, model.config().vocab_size, 2), p).tokens.size() == 8);
}
