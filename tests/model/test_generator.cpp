// The local generation engine: input errors, stopping rules (length, eos,
// context), streaming, chunked prefill, seeded sampling, the KV budget, and
// a decode loop that allocates nothing once warm.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

// Counting allocator for this test binary: counts operator new calls (every
// std::vector, std::string and Tensor shape goes through it) made by the
// thread that enabled counting. Only that thread: a helper thread of a
// library allocating now and then made the count flaky under load. (So an
// allocation in an OpenMP worker during a step would go unseen; the
// decode path's own code runs on the calling thread.)
namespace {
thread_local bool g_counting = false;
std::atomic<long> g_allocations{0};
}  // namespace

// GCC 12 sees std::allocator's inlined ::operator new and the free() below
// and warns of a mismatch; both are this file's (malloc inside).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace corolla;

namespace {

struct fixture {
  testing::temp_dir_guard dir{"generator"};
  transformer model;

  /// `family`: a llama-family variant (tiny_model_options::family).
  explicit fixture(architecture arch = architecture::llama, const std::string& family = "")
      : model(load(dir.path(), arch, family)) {}

  static transformer load(const std::filesystem::path& dir, architecture arch, const std::string& family = "") {
    testing::tiny_model_options o;
    o.arch = arch;
    if (!family.empty()) o.family = family;
    if (arch == architecture::gpt2) {
      o.kv_heads = o.heads;
      o.intermediate = 4 * o.hidden;
    }
    testing::write_tiny_model(dir, o);
    return transformer::load(dir, cpu_backend());
  }
};

std::string error_of(generator& gen, const std::vector<std::int32_t>& prompt,
                     const generation_params& p = {}) {
  try {
    gen.generate(prompt, p);
  } catch (const model_error& e) {
    return e.what();
  }
  return "(no model_error)";
}

std::vector<std::int32_t> ids(int n, int start = 1) {
  std::vector<std::int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((start + 7 * i) % 64);
  return v;
}

}  // namespace

TEST_CASE("generator rejects bad prompts with clear messages") {
  fixture f;
  generator gen(f.model);
  CHECK(error_of(gen, {1, 2, 64}) == "prompt id 64 is outside the vocabulary (64 tokens)");
  CHECK(error_of(gen, {-3}) == "prompt id -3 is outside the vocabulary (64 tokens)");
  CHECK(error_of(gen, ids(65)) == "prompt of 65 tokens exceeds the model context of 64");
  CHECK(error_of(gen, {}) == "the prompt is empty: give at least one token");
  generation_params bad;
  bad.sampling.top_p = 0.0f;
  CHECK(error_of(gen, {1, 2}, bad).find("top-p") != std::string::npos);
}

TEST_CASE("generation stops at max tokens, at the context, and at eos") {
  fixture f;
  generator gen(f.model);
  generation_params p;
  p.max_new_tokens = 10;
  p.ignore_eos = true;
  generation_result full = gen.generate(ids(5), p);
  CHECK(full.tokens.size() == 10);
  CHECK(full.reason == stop_reason::max_tokens);
  CHECK(full.prompt_tokens == 5);
  CHECK(full.decode_steps == 9);
  CHECK(full.prefill_seconds > 0);
  CHECK(full.decode_seconds > 0);

  // 60 prompt tokens + 10 asked for > 64: four tokens, then the context.
  generation_result ctx = gen.generate(ids(60), p);
  CHECK(ctx.tokens.size() == 4);
  CHECK(ctx.reason == stop_reason::context);
  generation_result none = gen.generate(ids(64), p);
  CHECK(none.tokens.empty());
  CHECK(none.reason == stop_reason::context);

  // The 4th greedy token as eos: generation ends there, eos included.
  p.ignore_eos = false;
  p.eos_id = full.tokens[3];
  generation_result eos = gen.generate(ids(5), p);
  const auto first = std::find(full.tokens.begin(), full.tokens.end(), p.eos_id);
  CHECK(eos.reason == stop_reason::eos);
  CHECK(eos.tokens == std::vector<std::int32_t>(full.tokens.begin(), first + 1));
  p.ignore_eos = true;
  CHECK(gen.generate(ids(5), p).tokens == full.tokens);
}

TEST_CASE("generation ends at any of the model's end-of-sequence ids, generation_config.json's included") {
  // The greedy tokens of a model without end-of-sequence ids.
  std::vector<std::int32_t> full;
  {
    fixture f;
    generator gen(f.model);
    generation_params p;
    p.max_new_tokens = 10;
    full = gen.generate(ids(5), p).tokens;
  }
  // config.json says 63 (never generated first); generation_config.json adds
  // the 4th greedy token: generation ends there, as with Llama 3.1's <|eot_id|>.
  testing::temp_dir_guard dir("generator-eos");
  testing::tiny_model_options o;
  o.eos = 63;
  testing::write_tiny_model(dir.path(), o);
  REQUIRE(std::find(full.begin(), full.begin() + 3, 63) == full.begin() + 3);
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": [63, " << full[3] << "], \"do_sample\": false}";
  const model_config cfg = load_config(dir.path());
  CHECK(cfg.eos_token_id == 63);
  CHECK(cfg.eos_token_ids == std::vector<int>{63, full[3]});
  transformer model = transformer::load(dir.path(), cpu_backend());
  generator gen(model);
  generation_params p;
  p.max_new_tokens = 10;
  const generation_result r = gen.generate(ids(5), p);
  const auto first = std::find(full.begin(), full.end(), full[3]);
  CHECK(r.reason == stop_reason::eos);
  CHECK(r.tokens == std::vector<std::int32_t>(full.begin(), first + 1));
  // A caller's own eos_id replaces the model's list.
  p.eos_id = 62;
  CHECK(gen.generate(ids(5), p).tokens.size() >= 4);
  // A malformed generation_config.json is one clear error.
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": \"x\"}";
  try {
    load_config(dir.path());
    FAIL("no error");
  } catch (const model_error& e) {
    CHECK(std::string(e.what()).find("generation_config.json") != std::string::npos);
  }
}

TEST_CASE("streamed tokens, chunked prefill and whole prefill agree") {
  for (auto arch : {architecture::llama, architecture::gpt2}) {
    fixture f(arch);
    generator gen(f.model);
    generation_params p;
    p.max_new_tokens = 20;
    p.ignore_eos = true;
    std::vector<std::int32_t> streamed;
    generation_result whole =
        gen.generate(ids(37), p, [&](std::int32_t id) { streamed.push_back(id); });
    CHECK(streamed == whole.tokens);
    for (int chunk : {1, 5, 16, 17}) {
      p.prefill_chunk = chunk;
      CHECK(gen.generate(ids(37), p).tokens == whole.tokens);
    }
  }
}

TEST_CASE("generators of one model share the first one's inference weights and generate as it does") {
  fixture f;
  const std::vector<std::int32_t> prompt = ids(9);
  generation_params p;
  p.max_new_tokens = 12;
  p.ignore_eos = true;
  for (weight_format w : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
    CAPTURE(weight_format_name(w));
    auto first = std::make_unique<generator>(f.model, 0, w);
    generator sibling(f.model, *first, 0, dtype::bf16);
    CHECK(sibling.weights() == w);
    // The same tensors, not copies: the blocks' linear weights and the LM head.
    const auto& mine = sibling.blocks().inference_block_weights();
    const auto& theirs = first->blocks().inference_block_weights();
    REQUIRE(mine.size() == theirs.size());
    REQUIRE_FALSE(mine.empty());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const Tensor& a = mine[i].qkv_w.defined() ? mine[i].qkv_w : mine[i].q_w;
      const Tensor& b = theirs[i].qkv_w.defined() ? theirs[i].qkv_w : theirs[i].q_w;
      REQUIRE(a.defined());
      CHECK(a.raw() == b.raw());
      CHECK(mine[i].down_w.raw() == theirs[i].down_w.raw());
    }
    REQUIRE(sibling.output_head().lm_head_inference().defined());
    CHECK(sibling.output_head().lm_head_inference().raw() == first->output_head().lm_head_inference().raw());
    // A generator that made its own copies generates the same tokens (its KV
    // cache in bf16 like the sibling's), and the sibling outlives the first.
    generator own(f.model, 0, w, dtype::bf16);
    const auto want = own.generate(prompt, p).tokens;
    first.reset();
    CHECK(sibling.generate(prompt, p).tokens == want);
  }
  // Another model's generator is refused.
  testing::temp_dir_guard other_dir("generator-other");
  testing::tiny_model_options o;
  o.layers = 3;
  testing::write_tiny_model(other_dir.path(), o);
  transformer other = transformer::load(other_dir.path(), cpu_backend());
  generator theirs(other, 0, weight_format::bf16);
  CHECK_THROWS_AS(generator(f.model, theirs), tensor_error);
}

TEST_CASE("a model loaded for inference only generates as one that kept its f32 parameters, and refuses training") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    fixture f(arch);
    const std::vector<std::int32_t> prompt = ids(9);
    generation_params p;
    p.max_new_tokens = 12;
    p.ignore_eos = true;
    for (weight_format w : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      CAPTURE(weight_format_name(w));
      transformer lean = transformer::load_inference(f.dir.path(), cpu_backend(), w);
      CHECK(lean.inference_only());
      CHECK_FALSE(f.model.inference_only());
      CHECK(lean.block_stage().params().empty());
      CHECK(lean.block_stage().inference_format() == w);
      CHECK(lean.block_stage().size() == f.model.config().n_layers);
      // The same tokens as a generator converting the f32 model's weights,
      // and a second generator of the lean model reads its weights.
      generator kept(f.model, 0, w);
      const auto want = kept.generate(prompt, p).tokens;
      auto first = std::make_unique<generator>(lean, 0, w);
      CHECK(first->generate(prompt, p).tokens == want);
      generator sibling(lean, *first, 0);
      CHECK(sibling.weights() == w);
      const auto& mine = sibling.blocks().inference_block_weights();
      const auto& model_weights = lean.block_stage().inference_block_weights();
      REQUIRE(mine.size() == model_weights.size());
      for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i].down_w.raw() == model_weights[i].down_w.raw());
      first.reset();
      CHECK(sibling.generate(prompt, p).tokens == want);
      // Its weights are the only ones it has: another format, and training, are refused.
      const weight_format other = w == weight_format::bf16 ? weight_format::int8 : weight_format::bf16;
      CHECK_THROWS_WITH_AS(generator(lean, 0, other), doctest::Contains("loaded with"), model_error);
      CHECK_THROWS_WITH_AS(generator(lean, 0, weight_format::f32), doctest::Contains("for inference only"),
                           model_error);
      CHECK_THROWS_WITH_AS(lean.blocks(), doctest::Contains("loaded for inference only"), tensor_error);
      CHECK_THROWS_AS(lean.groups(), tensor_error);
      CHECK_THROWS_WITH_AS(lean.save(f.dir.path() / "lean-copy"), doctest::Contains("loaded for inference only"),
                           tensor_error);
      CHECK_FALSE(std::filesystem::exists(f.dir.path() / "lean-copy"));
    }
  }
  CHECK_THROWS_AS(transformer::load_inference(fixture().dir.path(), cpu_backend(), weight_format::f32), tensor_error);
}

TEST_CASE("sampled generation is reproducible for a seed") {
  fixture f;
  generator gen(f.model);
  generation_params p;
  p.max_new_tokens = 16;
  p.ignore_eos = true;
  p.sampling = {1.0f, 20, 0.95f, 1234};
  auto a = gen.generate(ids(4), p).tokens;
  generator other(f.model);
  CHECK(other.generate(ids(4), p).tokens == a);
  p.sampling.seed = 99;
  CHECK(gen.generate(ids(4), p).tokens != a);
}

TEST_CASE("a KV budget too small for the prompt is a clear error") {
  fixture f;
  // One page of 16 tokens: 2 layers x K,V x 16 tokens x 2 kv heads x 8 dims x 4 bytes.
  const std::size_t page = 2 * 2 * 16 * 2 * 8 * 4;
  generator gen(f.model, page);
  generation_params one;
  one.max_new_tokens = 1;  // a 17th token would need a second page
  CHECK(gen.generate(ids(16), one).tokens.size() == 1);
  const std::string err = error_of(gen, ids(20));
  CHECK(err == "KV cache full: need 20 more tokens (" + std::to_string(2 * page) + " bytes), " +
                   std::to_string(page) + " bytes free of " + std::to_string(page));
}

TEST_CASE("decode steps allocate nothing once warm (f32, stacked bf16, int8 and nf4 weights, dense and "
          "mixture-of-experts)") {
  struct kind {
    architecture arch;
    std::string family;
  };
  for (const kind& k : {kind{architecture::llama, ""}, kind{architecture::gpt2, ""},
                        kind{architecture::llama, "MixtralForCausalLM"}})
    for (weight_format weights : {weight_format::f32, weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      CAPTURE(weight_format_name(weights));
      CAPTURE(k.family);
      fixture f(k.arch, k.family);
      generator gen(f.model, 0, weights);
      generation_params p;
      p.max_new_tokens = 10;  // positions 5..14 stay inside the first KV page
      p.ignore_eos = true;
      gen.generate(ids(5), p);  // warm-up: workspaces sized
      int seen = 0;
      long at_second = 0, at_last = 0;
      gen.generate(ids(5), p, [&](std::int32_t) {
        ++seen;
        if (seen == 2) {
          at_second = g_allocations.load();
          g_counting = true;
        }
        if (seen == 10) {
          g_counting = false;
          at_last = g_allocations.load();
        }
      });
      g_counting = false;
      CHECK(seen == 10);
      INFO("allocations during 8 decode steps: " << at_last - at_second);
      CHECK(at_last - at_second == 0);
    }
}
