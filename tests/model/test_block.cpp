// One block's and the head's backward against central finite differences of
// a scalar loss, for Llama (GQA, RoPE) and GPT-2 (biases, LayerNorm, GELU).
//
// Each check perturbs one tensor along a random direction d and compares
// (L(p + h d) - L(p - h d)) / 2h with <grad, d>: one number per tensor that
// involves every element of its gradient, robust in f32 where single-element
// differences drown in rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/head.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

namespace {

model_config small_config(architecture arch, int kv_heads, bool tied = false,
                          const std::function<void(testing::tiny_model_options&)>& tweak = {}) {
  testing::tiny_model_options o;
  o.arch = arch;
  o.vocab = 24;
  o.hidden = 16;
  o.heads = 4;
  o.kv_heads = kv_heads;
  o.intermediate = 24;
  o.max_positions = 16;
  o.tied = tied;
  if (tweak) tweak(o);
  return testing::tiny_config(o);
}

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

Tensor random_tensor(shape_t shape, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = normal(rng);
  return Tensor::from_f32(v, std::move(shape));
}

double dot(const Tensor& a, const Tensor& b) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

/// Checks <grad, d> against the fourth-order central difference of `loss`
/// when `target` moves along d (target is restored afterwards).
void check_direction(const std::string& what, Tensor target, const Tensor& grad,
                     const std::function<double()>& loss, std::uint64_t seed, double h = 4e-3) {
  Tensor d = random_tensor(target.shape(), seed);
  Tensor saved = target.clone();
  float* p = target.data<float>();
  const float* dv = d.data<float>();
  const float* s = saved.data<float>();
  auto at = [&](double step) {
    for (std::int64_t i = 0; i < target.numel(); ++i) p[i] = s[i] + static_cast<float>(step) * dv[i];
    return loss();
  };
  const double numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
  target.copy_from(saved);
  const double analytic = dot(grad, d);
  INFO(what << ": analytic " << analytic << ", numeric " << numeric);
  // The f32 forward's rounding (about 6e-6 relative), times 1.5 / h, puts the
  // difference quotient within ~2.5e-3 (relative) of the truth at h = 4e-3;
  // the truncation error is O(h^4), small also where the loss curves hard
  // (Qwen3's per-head norms: the second-order quotient at h = 3e-3 was off
  // by 0.8 %). A wrong gradient term is off by far more.
  CHECK(std::abs(analytic - numeric) <= 5e-3 * std::max(1.0, std::abs(analytic)));
}

std::vector<std::int32_t> iota_positions(int batch, int seq) {
  std::vector<std::int32_t> pos;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t) pos.push_back(t);
  return pos;
}

void check_block_backward(const model_config& cfg) {
  Backend& be = cpu_backend();
  const int B = 2, T = 5, N = B * T, D = cfg.hidden_size;
  param_set params(block_layout(cfg));
  fill_random(params, 11);
  param_set grads = params.like();
  block_tensors w = block_tensors::of(cfg, params);
  block_tensors g = block_tensors::of(cfg, grads);
  const auto pos_v = iota_positions(B, T);
  Tensor pos = Tensor::from_i32(pos_v, {N});
  Tensor x = random_tensor({N, D}, 5);
  Tensor r = random_tensor({N, D}, 6);  // L = sum(y * r), so dL/dy = r

  block_activations acts;
  Tensor y = Tensor::empty({N, D});
  auto loss = [&] {
    block_activations a;
    Tensor out = Tensor::empty({N, D});
    block_forward(be, cfg, w, x, pos, B, T, out, a);
    return dot(out, r);
  };
  block_forward(be, cfg, w, x, pos, B, T, y, acts);
  Tensor dx = Tensor::empty({N, D});
  block_grad_scratch scratch;
  block_backward(be, cfg, w, acts, pos, r, dx, g, scratch);

  check_direction("x", x, dx, loss, 100);
  // The input-only backward (frozen weights: swarm fine-tuning) gives the same dx.
  {
    Tensor dx_only = Tensor::empty({N, D});
    block_grad_scratch input_scratch;
    block_backward_input(be, cfg, w, acts, pos, r, dx_only, input_scratch);
    const std::vector<float> want = dx.to_vector(), got = dx_only.to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(want[i] - got[i])));
    CHECK(worst < 1e-5);
  }
  std::uint64_t seed = 200;
  for (const auto& e : params.entries())
    check_direction(e.name, params.get(e.name), grads.get(e.name), loss, seed++);

  // Parameter gradients accumulate: a second backward doubles them.
  Tensor once = grads.flat().clone();
  block_backward(be, cfg, w, acts, pos, r, dx, g, scratch);
  const float* a = once.data<float>();
  const float* b = grads.flat().data<float>();
  double worst = 0;
  for (std::int64_t i = 0; i < once.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(b[i] - 2 * a[i])));
  CHECK(worst < 1e-4);
}

/// `chunk` > 0: the loss forms the logits that many rows at a time.
void check_head_backward(const model_config& cfg, std::int64_t chunk = 0) {
  Backend& be = cpu_backend();
  const int N = 7, D = cfg.hidden_size, V = cfg.vocab_size;
  head h(cfg, be);
  h.set_loss_chunk_rows(chunk);
  fill_random(h.params(), 21);
  std::vector<std::int32_t> ids_v, pos_v, tgt_v;
  for (int i = 0; i < N; ++i) {
    ids_v.push_back((i * 7 + 3) % V);
    pos_v.push_back(i);
    tgt_v.push_back(i == 4 ? -1 : (i * 5 + 1) % V);  // one ignored row
  }
  Tensor ids = Tensor::from_i32(ids_v, {N}), pos = Tensor::from_i32(pos_v, {N});
  Tensor targets = Tensor::from_i32(tgt_v, {N});
  Tensor x = Tensor::empty({N, D}), dx = Tensor::empty({N, D});
  head_activations acts;
  // Embedding -> final norm -> LM head -> mean cross-entropy (x2.5).
  auto loss = [&] {
    head_activations a;
    Tensor e = Tensor::empty({N, D});
    h.embed(ids, pos, e);
    return 2.5 * h.loss(e, targets, nullptr, 1.0f, a);
  };
  h.embed(ids, pos, x);
  const float value = h.loss(x, targets, &dx, 2.5f, acts);
  CHECK(2.5 * value == doctest::Approx(loss()).epsilon(1e-5));
  h.embed_backward(ids, pos, dx);
  std::uint64_t seed = 300;
  for (const auto& e : h.params().entries())
    check_direction(e.name, h.params().get(e.name), h.grads().get(e.name), loss, seed++);
}

}  // namespace

TEST_CASE("llama block backward matches finite differences (GQA)") {
  check_block_backward(small_config(architecture::llama, 2));
}

TEST_CASE("llama block backward matches finite differences (MHA)") {
  check_block_backward(small_config(architecture::llama, 4));
}

TEST_CASE("qwen2 block backward (q/k/v biases) matches finite differences") {
  check_block_backward(small_config(architecture::llama, 2, false, [](auto& o) { o.family = "Qwen2ForCausalLM"; }));
}

TEST_CASE("qwen3 block backward (per-head q/k norms, head_dim apart from hidden/heads, biases) matches finite differences") {
  check_block_backward(small_config(architecture::llama, 2, false, [](auto& o) {
    o.family = "Qwen3ForCausalLM";
    o.head_dim = 8;  // 4 heads x 8 = 32 != hidden 16
    o.attention_bias = true;
  }));
}

TEST_CASE("llama block backward with yarn-scaled RoPE matches finite differences") {
  check_block_backward(small_config(architecture::llama, 2, false, [](auto& o) {
    o.rope_scaling = R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})";
  }));
}

TEST_CASE("gpt2 block backward matches finite differences") {
  check_block_backward(small_config(architecture::gpt2, 4));
}

TEST_CASE("head backward matches finite differences (llama untied)") {
  check_head_backward(small_config(architecture::llama, 2, false));
}

TEST_CASE("head backward matches finite differences (llama tied)") {
  check_head_backward(small_config(architecture::llama, 2, true));
}

TEST_CASE("head backward matches finite differences (gpt2)") {
  check_head_backward(small_config(architecture::gpt2, 4));
}

TEST_CASE("head backward matches finite differences with the loss in chunks of rows") {
  check_head_backward(small_config(architecture::llama, 2, true), 3);  // chunks of 3, 3 and 1 rows
  check_head_backward(small_config(architecture::gpt2, 4), 2);
}

TEST_CASE("the loss in chunks of rows gives one chunk's loss and gradients, with a chunk's logits at most") {
  for (const model_config& cfg : {small_config(architecture::llama, 2), small_config(architecture::llama, 2, true),
                                  small_config(architecture::gpt2, 4)}) {
    CAPTURE(cfg.hf_architecture);
    CAPTURE(cfg.tie_embeddings);
    const int N = 7, D = cfg.hidden_size, V = cfg.vocab_size;
    head h(cfg, cpu_backend());
    fill_random(h.params(), 23);
    std::vector<std::int32_t> tgt_v;
    for (int i = 0; i < N; ++i) tgt_v.push_back(i == 5 ? -1 : (i * 3 + 2) % V);
    const Tensor targets = Tensor::from_i32(tgt_v, {N});
    const Tensor x = random_tensor({N, D}, 41);
    // One chunk (all 7 rows): the reference.
    Tensor dx1 = Tensor::empty({N, D});
    head_activations a1;
    const float l1 = h.loss(x, targets, &dx1, 1.5f, a1);
    CHECK(a1.logits.dim(0) == N);
    const std::vector<float> g1 = h.grads().flat().to_vector();
    for (const std::int64_t chunk : {1, 2, 3, 6}) {
      CAPTURE(chunk);
      h.zero_grads();
      h.set_loss_chunk_rows(chunk);
      CHECK(h.loss_chunk_rows(N) == chunk);
      Tensor dx = Tensor::empty({N, D});
      head_activations a;
      const float l = h.loss(x, targets, &dx, 1.5f, a);
      CHECK(a.logits.dim(0) == chunk);  // never more than a chunk of logits
      CHECK(l == doctest::Approx(l1).epsilon(1e-6));
      CHECK(testing::max_abs_diff(dx.to_vector(), dx1.to_vector()) < 1e-6);
      CHECK(testing::max_abs_diff(h.grads().flat().to_vector(), g1) < 1e-5);
      // A frozen head (prompt tuning): dx alone, the same, and no gradient.
      h.zero_grads();
      Tensor frozen_dx = Tensor::empty({N, D});
      head_activations af;
      CHECK(h.loss(x, targets, &frozen_dx, 1.5f, af, /*param_grads=*/false) == doctest::Approx(l1).epsilon(1e-6));
      CHECK(testing::max_abs_diff(frozen_dx.to_vector(), dx1.to_vector()) < 1e-6);
      CHECK(testing::max_abs_diff(h.grads().flat().to_vector(), std::vector<float>(g1.size(), 0.0f)) == 0.0);
      // The loss alone.
      head_activations al;
      CHECK(h.loss(x, targets, nullptr, 1.0f, al) == doctest::Approx(l1).epsilon(1e-6));
    }
  }
  head h(small_config(architecture::llama, 2), cpu_backend());
  CHECK(h.loss_chunk_rows(1 << 30) == head::loss_logits_budget / (4 * 24));  // the budget, vocabulary 24
  CHECK(h.loss_chunk_rows(5) == 5);
  CHECK_THROWS_AS(h.set_loss_chunk_rows(-1), tensor_error);
  // A bad target in a later chunk fails before any chunk adds gradients.
  h.set_loss_chunk_rows(2);
  const Tensor x = random_tensor({5, 16}, 43);
  Tensor dx = Tensor::empty({5, 16});
  head_activations a;
  CHECK_THROWS_WITH_AS(h.loss(x, Tensor::from_i32(std::vector<std::int32_t>{1, 2, 3, 4, 24}, {5}), &dx, 1.0f, a),
                       "head::loss: target 24 at row 4 is outside the vocabulary [0, 24) and is not -1 (ignored)",
                       tensor_error);
  CHECK(h.grads().flat().to_vector() == std::vector<float>(static_cast<std::size_t>(h.grads().size()), 0.0f));
}

TEST_CASE("block layouts follow the canonical names") {
  auto llama = block_layout(small_config(architecture::llama, 2));
  REQUIRE(llama.size() == 9);
  CHECK(llama[1].first == "q.weight");
  CHECK(llama[1].second == shape_t{16, 16});
  CHECK(llama[2].second == shape_t{8, 16});  // 2 kv heads x 4
  auto gpt2 = block_layout(small_config(architecture::gpt2, 4));
  CHECK(gpt2.size() == 16);
  auto tied = head_layout(small_config(architecture::llama, 2, true));
  CHECK(tied.size() == 2);
  auto untied = head_layout(small_config(architecture::llama, 2, false));
  CHECK(untied.back().first == "lm_head.weight");
  auto gpt2_head = head_layout(small_config(architecture::gpt2, 4));
  CHECK(gpt2_head.size() == 4);
}
