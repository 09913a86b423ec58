// adamw_optimizer: the torch AdamW formula over several parameter groups,
// global-norm gradient clipping, decay of every parameter, restorable state.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"
#include "model/optimizer.hpp"
#include "model/params.hpp"

namespace {

using namespace corolla;

// Two groups shaped like a block and a head (names matter only for the
// "every parameter" check: norms, biases and embeddings are decayed too).
param_set block_layout() {
  return param_set({{"attn_norm.weight", {8}}, {"q.weight", {8, 8}}, {"q.bias", {8}},
                    {"up.weight", {12, 8}}});
}
param_set head_layout() {
  return param_set({{"embed.weight", {10, 8}}, {"final_norm.weight", {8}}, {"final_norm.bias", {8}}});
}

// Fills the real entries (not the alignment padding) with N(0, std).
void fill_random(param_set& ps, std::mt19937& rng, float std_dev) {
  std::normal_distribution<float> nd(0.0f, std_dev);
  float* base = ps.flat().data<float>();
  for (const auto& e : ps.entries())
    for (std::int64_t i = 0; i < e.numel; ++i) base[e.offset + i] = nd(rng);
}

std::vector<double> as_double(const param_set& ps) {
  std::vector<float> f = ps.flat().to_vector();
  return {f.begin(), f.end()};
}

// torch.optim.AdamW, one step, in double.
void reference_step(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                     std::vector<double>& v, const adamw_params& h, std::int64_t t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t));
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1.0 - static_cast<double>(h.lr) * h.weight_decay;
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
    v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g[i] * g[i];
    p[i] -= h.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + h.eps);
  }
}

double max_abs_diff(const std::vector<double>& a, const param_set& b) {
  std::vector<float> f = b.flat().to_vector();
  REQUIRE(f.size() == a.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - f[i]));
  return worst;
}

}  // namespace

TEST_CASE("AdamW over two parameter groups follows the torch formula step by step") {
  std::mt19937 rng(5);
  param_set block = block_layout(), head = head_layout();
  param_set block_g = block.like(), head_g = head.like();
  fill_random(block, rng, 0.5f);
  fill_random(head, rng, 0.5f);

  optimizer_settings s;
  s.adamw = {.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.05f};
  adamw_optimizer opt({{&block, &block_g}, {&head, &head_g}}, s, cpu_backend());
  REQUIRE(opt.group_count() == 2);
  CHECK(opt.size() == block.size() + head.size());
  CHECK(opt.steps() == 0);

  std::vector<double> p[2] = {as_double(block), as_double(head)};
  std::vector<double> m[2] = {std::vector<double>(p[0].size()), std::vector<double>(p[1].size())};
  std::vector<double> v[2] = {m[0], m[1]};
  for (int t = 1; t <= 5; ++t) {
    fill_random(block_g, rng, 0.1f * t);
    fill_random(head_g, rng, 0.01f);
    CHECK(opt.step() == -1.0);  // clipping off: no norm computed
    reference_step(p[0], as_double(block_g), m[0], v[0], s.adamw, t);
    reference_step(p[1], as_double(head_g), m[1], v[1], s.adamw, t);
    INFO("step " << t);
    CHECK(opt.steps() == t);
    CHECK(max_abs_diff(p[0], block) < 1e-6);
    CHECK(max_abs_diff(p[1], head) < 1e-6);
    CHECK(max_abs_diff(m[1], opt.m(1)) < 1e-7);
    CHECK(max_abs_diff(v[0], opt.v(0)) < 1e-7);
  }
}

TEST_CASE("gradient clipping scales gradients to the global max norm and is off by default") {
  std::mt19937 rng(9);
  param_set a = block_layout(), b = head_layout();
  param_set ga = a.like(), gb = b.like();
  fill_random(ga, rng, 1.0f);
  fill_random(gb, rng, 1.0f);
  const std::vector<double> ga0 = as_double(ga), gb0 = as_double(gb);
  double sq = 0.0;
  for (double x : ga0) sq += x * x;
  for (double x : gb0) sq += x * x;
  const double norm = std::sqrt(sq);
  REQUIRE(norm > 2.0);

  SUBCASE("off by default: gradients untouched") {
    adamw_optimizer opt({{&a, &ga}, {&b, &gb}}, optimizer_settings{}, cpu_backend());
    CHECK(opt.settings().max_grad_norm <= 0.0f);
    CHECK(std::abs(opt.grad_norm() - norm) < 1e-4 * norm);
    CHECK(opt.step() == -1.0);
    CHECK(max_abs_diff(ga0, ga) == 0.0);
    CHECK(max_abs_diff(gb0, gb) == 0.0);
  }
  SUBCASE("a norm above the limit is scaled down to it, across both groups") {
    optimizer_settings s;
    s.max_grad_norm = 1.0f;
    std::vector<double> pa = as_double(a), pb = as_double(b);
    adamw_optimizer opt({{&a, &ga}, {&b, &gb}}, s, cpu_backend());
    const double reported = opt.step();
    CHECK(std::abs(reported - norm) < 1e-4 * norm);
    // The update saw the gradients scaled to norm 1 (inside AdamW's pass:
    // the buffers keep their values).
    const double coef = 1.0 / (norm + 1e-6);
    std::vector<double> want_a = ga0, want_b = gb0;
    for (double& x : want_a) x *= coef;
    for (double& x : want_b) x *= coef;
    std::vector<double> ma(pa.size()), va(pa.size()), mb(pb.size()), vb(pb.size());
    reference_step(pa, want_a, ma, va, s.adamw, 1);
    reference_step(pb, want_b, mb, vb, s.adamw, 1);
    CHECK(max_abs_diff(ma, opt.m(0)) < 1e-7);
    CHECK(max_abs_diff(mb, opt.m(1)) < 1e-7);
    CHECK(max_abs_diff(va, opt.v(0)) < 1e-9);
    CHECK(max_abs_diff(pa, a) < 1e-6);
    CHECK(max_abs_diff(pb, b) < 1e-6);
    CHECK(max_abs_diff(ga0, ga) == 0.0);
  }
  SUBCASE("a norm below the limit is left alone") {
    optimizer_settings s;
    s.max_grad_norm = static_cast<float>(norm * 2);
    adamw_optimizer opt({{&a, &ga}, {&b, &gb}}, s, cpu_backend());
    CHECK(std::abs(opt.step() - norm) < 1e-4 * norm);
    CHECK(max_abs_diff(ga0, ga) == 0.0);
  }
}

TEST_CASE("weight decay shrinks every parameter, norms, biases and embeddings included") {
  std::mt19937 rng(3);
  param_set block = block_layout(), head = head_layout();
  param_set block_g = block.like(), head_g = head.like();  // zero gradients
  fill_random(block, rng, 1.0f);
  fill_random(head, rng, 1.0f);
  const std::vector<double> before[2] = {as_double(block), as_double(head)};
  optimizer_settings s;
  s.adamw.lr = 0.1f;
  s.adamw.weight_decay = 0.2f;
  adamw_optimizer opt({{&block, &block_g}, {&head, &head_g}}, s, cpu_backend());
  opt.step();
  // With zero gradients the Adam term is 0 / (0 + eps) = 0: only the
  // decoupled decay p *= 1 - lr * wd acts.
  const param_set* sets[2] = {&block, &head};
  for (int g = 0; g < 2; ++g)
    for (const auto& e : sets[g]->entries()) {
      const std::vector<float> now = sets[g]->get(e.name).to_vector();
      INFO(e.name);
      for (std::int64_t i = 0; i < e.numel; ++i) {
        const double want = before[g][e.offset + i] * 0.98;
        REQUIRE(std::abs(now[i] - want) < 1e-6 * std::max(1.0, std::abs(want)));
      }
    }
}

TEST_CASE("optimizer state restored into a fresh optimizer continues identically") {
  std::mt19937 rng(21);
  param_set p1 = head_layout();
  fill_random(p1, rng, 1.0f);
  param_set g1 = p1.like();
  param_set p2 = p1.like();
  param_set g2 = p1.like();
  optimizer_settings s;
  s.adamw.weight_decay = 0.1f;
  adamw_optimizer a({{&p1, &g1}}, s, cpu_backend());
  for (int t = 0; t < 3; ++t) {
    fill_random(g1, rng, 0.3f);
    a.step();
  }
  // Checkpoint: parameters, m, v, step counter.
  p2.flat().copy_from(p1.flat());
  adamw_optimizer b({{&p2, &g2}}, s, cpu_backend());
  b.m(0).flat().copy_from(a.m(0).flat());
  b.v(0).flat().copy_from(a.v(0).flat());
  b.set_steps(a.steps());
  fill_random(g1, rng, 0.3f);
  g2.flat().copy_from(g1.flat());
  a.step();
  b.step();
  CHECK(b.steps() == 4);
  CHECK(max_abs_diff(as_double(p1), p2) == 0.0);
  CHECK_THROWS_AS(b.set_steps(-1), std::invalid_argument);
}

TEST_CASE("an optimizer group whose gradients do not match its parameters is rejected") {
  param_set p = block_layout();
  param_set g = head_layout();
  CHECK_THROWS_AS(adamw_optimizer({{&p, &g}}, optimizer_settings{}, cpu_backend()),
                  std::invalid_argument);
  CHECK_THROWS_AS(adamw_optimizer({{&p, nullptr}}, optimizer_settings{}, cpu_backend()),
                  std::invalid_argument);
}

TEST_CASE("the learning-rate schedule warms up linearly, then decays by a half cosine to its floor") {
  using corolla::lr_schedule;
  using corolla::scheduled_lr;
  const lr_schedule constant{};
  CHECK(scheduled_lr(0.5f, constant, 1, 10) == 0.5f);
  CHECK(scheduled_lr(0.5f, constant, 10, 10) == 0.5f);
  const lr_schedule warm{4, false, 0.1f};
  CHECK(scheduled_lr(1.0f, warm, 1, 10) == doctest::Approx(0.25));
  CHECK(scheduled_lr(1.0f, warm, 4, 10) == doctest::Approx(1.0));
  CHECK(scheduled_lr(1.0f, warm, 9, 10) == doctest::Approx(1.0));
  const lr_schedule cosine{2, true, 0.1f};
  CHECK(scheduled_lr(1.0f, cosine, 2, 12) == doctest::Approx(1.0));
  CHECK(scheduled_lr(1.0f, cosine, 7, 12) == doctest::Approx(0.55));  // halfway: 0.1 + 0.9 / 2
  CHECK(scheduled_lr(1.0f, cosine, 12, 12) == doctest::Approx(0.1));
  CHECK(scheduled_lr(1.0f, cosine, 20, 12) == doctest::Approx(0.1));  // past the end: the floor
}
