// tests/model/test_span_engine_stateless.cpp — the span engine's stateless
// forward and backward with deep prompts (what training through a server
// runs): against the stage and each sequence's prefill, gradients against
// finite differences, and bad shapes as clear errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/span_engine.hpp"
#include "model/stage.hpp"
#include "tests/model/span_engine_test_util.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::check_direction;
using corolla::testing::code_of;
using corolla::testing::dot;
using corolla::testing::error_of;
using corolla::testing::gpt2_opts;
using corolla::testing::llama_opts;
using corolla::testing::max_rel_diff;
using corolla::testing::model_dir;
using corolla::testing::random_tensor;
using corolla::testing::same_values;

TEST_CASE("the stateless forward equals the stage's forward and each sequence's prefill") {
  for (const auto& o : {llama_opts(), gpt2_opts()}) {
    model_dir m(o);
    const int B = 3, T = 9;
    const std::int64_t D = m.cfg.hidden_size;
    span_engine e = m.engine(0, 2);
    stage s = stage::load(m.ck, m.cfg, 0, 2, cpu_backend());
    const Tensor x = random_tensor({B * T, D}, 1);
    auto got = e.forward(x, B, T);
    REQUIRE(got);
    Tensor want = Tensor::empty({B * T, D});
    s.forward(x, B, T, want, nullptr);
    CHECK(same_values(*got, want));
    // Zero deep prompts change nothing.
    auto zero = e.forward(x, B, T, Tensor::zeros({2, 4, D}));
    REQUIRE(zero);
    CHECK(same_values(*zero, want));
    // Each sequence alone, through a session, gives the same rows.
    for (int b = 0; b < B; ++b) {
      const std::string id = "seq" + std::to_string(b);
      REQUIRE(e.open_session(id, T));
      auto out = e.inference_step(id, x.slice(b * T, (b + 1) * T), 0);
      REQUIRE(out);
      CHECK(max_rel_diff(*out, got->slice(b * T, (b + 1) * T)) < 1e-4);
    }
    // Deep prompts: block i's prompt added to the first P rows of each
    // sequence at block i's input, by hand with the stage's blocks.
    const Tensor prompts = random_tensor({2, 4, D}, 2, 0.5f);
    auto with = e.forward(x, B, T, prompts);
    REQUIRE(with);
    std::vector<param_set> blocks0(s.params().begin(), s.params().begin() + 1);
    std::vector<param_set> blocks1(s.params().begin() + 1, s.params().end());
    stage s0(m.cfg, 0, blocks0, cpu_backend()), s1(m.cfg, 1, blocks1, cpu_backend());
    Tensor h = x.clone(), h1 = Tensor::empty({B * T, D}), h2 = Tensor::empty({B * T, D});
    auto add_prompt = [&](Tensor& t, int block) {
      for (int b = 0; b < B; ++b)
        for (int p = 0; p < 4; ++p)
          for (std::int64_t d = 0; d < D; ++d)
            t.data<float>()[(b * T + p) * D + d] += prompts.data<float>()[(block * 4 + p) * D + d];
    };
    add_prompt(h, 0);
    s0.forward(h, B, T, h1, nullptr);
    add_prompt(h1, 1);
    s1.forward(h1, B, T, h2, nullptr);
    CHECK(max_rel_diff(*with, h2) < 1e-6);
  }
}

TEST_CASE("the stateless forward reports each row's smallest routing margin over its blocks") {
  // A mixture of experts: each row's margin is the smallest routing_margin
  // of that row over the blocks run, as each block's own routing gives it.
  auto o = corolla::testing::llama_opts(3);
  o.family = "MixtralForCausalLM";
  o.experts = 4;
  o.experts_per_token = 2;
  model_dir m(o);
  const int B = 2, T = 5;
  const std::int64_t D = m.cfg.hidden_size;
  span_engine e = m.engine(0, 3);
  const Tensor x = random_tensor({B * T, D}, 3);
  std::vector<float> margins;
  auto got = e.forward(x, B, T, Tensor(), 1, 3, &margins);
  REQUIRE(got);
  REQUIRE(margins.size() == static_cast<std::size_t>(B * T));
  // By hand: blocks 1 and 2, each block's routing margins folded.
  stage s = stage::load(m.ck, m.cfg, 1, 3, cpu_backend());
  std::vector<float> want(static_cast<std::size_t>(B * T), INFINITY);
  Tensor h = x.clone(), next = Tensor::empty({B * T, D});
  std::vector<std::int32_t> pos;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) pos.push_back(t);
  const Tensor positions = Tensor::from_i32(pos, {B * T});
  for (int i = 0; i < 2; ++i) {
    block_activations a;
    block_forward(cpu_backend(), m.cfg, block_tensors::of(m.cfg, s.params()[static_cast<std::size_t>(i)]), h,
                  positions, B, T, next, a);
    for (std::int64_t r = 0; r < B * T; ++r)
      want[static_cast<std::size_t>(r)] = std::min(want[static_cast<std::size_t>(r)], routing_margin(a.moe.route, r));
    std::swap(h, next);
  }
  CHECK(margins == want);
  CHECK(same_values(*got, h));
  for (float v : margins) {
    CHECK(v >= 0.0f);
    CHECK(v <= 1.0f);
  }
  // A dense model reports +inf for every row.
  model_dir dense(corolla::testing::llama_opts());
  span_engine d = dense.engine(0, 2);
  REQUIRE(d.forward(x, B, T, Tensor(), -1, -1, &margins));
  REQUIRE(margins.size() == static_cast<std::size_t>(B * T));
  for (float v : margins) CHECK(std::isinf(v));
}

namespace {

void fill_random(param_set& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& e : p.entries()) {
    Tensor t = p.get(e.name);
    float* v = t.data<float>();
    const bool norm = e.name.find("norm.weight") != std::string::npos;
    const float scale = e.name.find("bias") != std::string::npos ? 0.1f : norm ? 0.1f : 0.3f;
    for (std::int64_t i = 0; i < e.numel; ++i) v[i] = (norm ? 1.0f : 0.0f) + scale * normal(rng);
  }
}

void check_backward(architecture arch, int kv_heads) {
  testing::tiny_model_options o;
  o.arch = arch;
  o.hidden = 16;
  o.heads = 4;
  o.kv_heads = arch == architecture::gpt2 ? 4 : kv_heads;
  o.intermediate = 24;
  o.layers = 3;
  o.max_positions = 16;
  const model_config cfg = testing::tiny_config(o);
  Backend& be = cpu_backend();
  std::vector<param_set> params;
  for (int i = 0; i < 2; ++i) {
    params.emplace_back(block_layout(cfg));
    fill_random(params.back(), 11 + static_cast<std::uint64_t>(i));
  }
  // The engine hosts blocks [1, 3); a reference stage shares its weights.
  span_engine e(stage(cfg, 1, params, be), 64);
  stage ref(cfg, 1, params, be);
  const int B = 2, T = 5, P = 3;
  const std::int64_t N = B * T, D = cfg.hidden_size;
  Tensor x = random_tensor({N, D}, 5);
  Tensor prompts = random_tensor({2, P, D}, 6, 0.5f);
  const Tensor r = random_tensor({N, D}, 7);  // L = sum(out * r): dL/dout = r

  // Without prompts: the input gradient equals the full stage backward's.
  auto plain = e.backward(x, r, B, T);
  REQUIRE(plain);
  CHECK_FALSE(plain->grad_prompts.defined());
  stage_activations acts;
  Tensor y = Tensor::empty({N, D}), dx = Tensor::empty({N, D});
  ref.forward(x, B, T, y, &acts);
  ref.backward(acts, r, dx);
  CHECK(max_rel_diff(plain->grad_input, dx) < 1e-4);
  auto loss_plain = [&] { return dot(*e.forward(x, B, T), r); };
  check_direction("input (no prompts)", x, plain->grad_input, loss_plain, 100);

  // With deep prompts: input and prompt gradients by finite differences.
  auto grads = e.backward(x, r, B, T, prompts);
  REQUIRE(grads);
  REQUIRE(grads->grad_prompts.shape() == shape_t{2, P, D});
  auto loss = [&] { return dot(*e.forward(x, B, T, prompts), r); };
  check_direction("input", x, grads->grad_input, loss, 200);
  check_direction("prompts", prompts, grads->grad_prompts, loss, 300);
  // Each block's prompt on its own.
  for (int i = 0; i < 2; ++i) {
    Tensor one = prompts.slice(i, i + 1);
    check_direction("prompt of block " + std::to_string(1 + i), one,
                    grads->grad_prompts.slice(i, i + 1), loss, 400 + static_cast<std::uint64_t>(i));
  }
}

}  // namespace

TEST_CASE("stateless backward gradients match finite differences, deep prompts included") {
  SUBCASE("llama GQA") { check_backward(architecture::llama, 2); }
  SUBCASE("llama MHA") { check_backward(architecture::llama, 4); }
  SUBCASE("gpt2") { check_backward(architecture::gpt2, 4); }
}

TEST_CASE("stateless requests with bad shapes are clear errors") {
  model_dir m(llama_opts());
  const std::int64_t D = m.cfg.hidden_size;
  span_engine e = m.engine(0, 2, 64, {16, 100});
  const Tensor x = random_tensor({2 * 5, D}, 1);
  CHECK(error_of(e.forward(x, 0, 5)) == "batch size and sequence length must be positive, got 0 x 5");
  CHECK(error_of(e.forward(random_tensor({65, D}, 1), 1, 65)) ==
        "sequence of 65 tokens exceeds the model context of 64");
  CHECK(error_of(e.forward(random_tensor({101, D}, 1), 101, 1)) ==
        "101 x 1 = 101 rows exceed this server's limit of 100 rows per request");
  CHECK(error_of(e.forward(x, 2, 4)) == "hidden states have 10 rows, expected 2 x 4 = 8");
  CHECK(error_of(e.forward(random_tensor({10, 8}, 1), 2, 5)) ==
        "hidden states must be [n, 32] (the model's hidden size is 32), got [10, 8]");
  CHECK(error_of(e.forward(x, 2, 5, Tensor::zeros({2, 6, D}))) ==
        "deep prompts must be float [2 blocks, P, 32] on the host with 1 <= P <= 5 (the "
        "sequence length), got f32 [2, 6, 32] on cpu");
  CHECK(code_of(e.forward(x, 2, 5, Tensor::zeros({1, 2, D}))) == span_errc::invalid_argument);
  CHECK(error_of(e.backward(x, random_tensor({2 * 5, 8}, 1), 2, 5)) ==
        "output gradients must be [n, 32] (the model's hidden size is 32), got [10, 8]");
  CHECK(error_of(e.backward(x, random_tensor({8, D}, 1), 2, 5)) ==
        "output gradients are [8, 32], the hidden states [10, 32]");
  CHECK(e.forward(x, 2, 5));
}
