// tests/model/test_moe.cpp — the mixture-of-experts MLP (model/moe.hpp;
// its host routing is tests/model/test_moe_routing.cpp): moe_forward
// against a float64 loop written from HF's MixtralSparseMoeBlock /
// Qwen2MoeSparseMoeBlock (with its gated shared expert) /
// Qwen3MoeSparseMoeBlock, and a whole MoE block's backward (dx, the router,
// every expert, the shared expert and its gate) against finite differences.
//
// Routing is piecewise: a finite difference is only meaningful while no row
// changes its experts. The block checks choose inputs whose top-k logit
// margins are not tiny, watch the routing of every perturbed forward, and
// take another perturbation direction when one would move a row to another
// expert (instead of comparing across the jump).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/moe.hpp"
#include "tests/model/moe_test_util.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::random_tensor;
using namespace corolla::moe_test;

namespace {

// Routing helpers: tests/model/moe_test_util.hpp.

// ---- moe_forward ----------------------------------------------------------------

model_config moe_config(const std::string& family, int experts, int k, bool norm_topk_prob, int hidden = 16,
                        int intermediate = 24) {
  testing::tiny_model_options o;
  o.family = family;
  o.vocab = 24;
  o.hidden = hidden;
  o.heads = 4;
  o.kv_heads = 2;
  o.intermediate = intermediate;
  o.max_positions = 16;
  o.experts = experts;
  o.experts_per_token = k;
  o.norm_topk_prob = norm_topk_prob;
  o.shared_expert = 20;  // Qwen2-MoE only
  if (family == "Qwen3MoeForCausalLM") {
    o.head_dim = 8;  // 4 heads x 8 = 32 != hidden 16
    o.attention_bias = true;
  }
  const model_config c = testing::tiny_config(o);
  REQUIRE(c.is_moe());
  REQUIRE(c.n_experts == experts);
  REQUIRE(c.experts_per_token == k);
  return c;
}

/// out[D] += scale * SwiGLU expert `e` of row x (double).
void reference_expert(const expert_tensors& e, const float* x, std::int64_t D, double scale, double* out) {
  const std::int64_t F = e.gate_w.dim(0);
  const std::vector<float> g = e.gate_w.to_vector(), u = e.up_w.to_vector(), dn = e.down_w.to_vector();
  std::vector<double> act(static_cast<std::size_t>(F));
  for (std::int64_t f = 0; f < F; ++f) {
    double a = 0, b = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      a += double(g[f * D + d]) * x[d];
      b += double(u[f * D + d]) * x[d];
    }
    act[static_cast<std::size_t>(f)] = a / (1.0 + std::exp(-a)) * b;
  }
  for (std::int64_t d = 0; d < D; ++d) {
    double s = 0;
    for (std::int64_t f = 0; f < F; ++f) s += double(dn[d * F + f]) * act[static_cast<std::size_t>(f)];
    out[d] += scale * s;
  }
}

/// y [n, D] of HF's sparse MoE block in double: softmax of the router
/// logits, top-k (ties to the lower index), optional renormalisation, the
/// weighted sum of the chosen experts' SwiGLU MLPs, and Qwen2-MoE's shared
/// expert scaled by sigmoid(shared_expert_gate(x)). Also returns the
/// smallest top-k logit margin over the rows.
std::vector<double> reference_moe(const model_config& cfg, const block_tensors& w, const Tensor& x, double& min_margin) {
  const std::int64_t n = x.dim(0), D = cfg.hidden_size;
  const int E = cfg.n_experts, k = cfg.experts_per_token;
  const std::vector<float> xv = x.to_vector(), rv = w.router_w.to_vector();
  std::vector<double> y(static_cast<std::size_t>(n * D), 0.0);
  min_margin = 1e300;
  for (std::int64_t t = 0; t < n; ++t) {
    std::vector<double> logits(static_cast<std::size_t>(E), 0.0);
    for (int e = 0; e < E; ++e)
      for (std::int64_t d = 0; d < D; ++d) logits[static_cast<std::size_t>(e)] += double(rv[e * D + d]) * xv[t * D + d];
    std::vector<int> order(static_cast<std::size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    if (k < E) min_margin = std::min(min_margin, logits[order[k - 1]] - logits[order[k]]);
    const std::vector<int> chosen(order.begin(), order.begin() + k);
    const std::vector<double> weights = reference_weights(logits, chosen, cfg.norm_topk_prob);
    for (int j = 0; j < k; ++j)
      reference_expert(w.experts[static_cast<std::size_t>(chosen[static_cast<std::size_t>(j)])], xv.data() + t * D, D,
                       weights[static_cast<std::size_t>(j)], y.data() + t * D);
    if (cfg.has_shared_expert()) {
      const std::vector<float> gate = w.shared_gate_w.to_vector();
      double z = 0;
      for (std::int64_t d = 0; d < D; ++d) z += double(gate[static_cast<std::size_t>(d)]) * xv[t * D + d];
      reference_expert(w.experts[static_cast<std::size_t>(E)], xv.data() + t * D, D, 1.0 / (1.0 + std::exp(-z)),
                       y.data() + t * D);
    }
  }
  return y;
}

/// A block's mixture-of-experts weights of random N(0, scale) values for
/// `cfg`: the router (N(0, 0.4)), the E experts, and the shared expert and
/// its gate when cfg has one.
block_tensors random_moe(const model_config& cfg, std::uint64_t seed, float scale = 0.3f) {
  const std::int64_t D = cfg.hidden_size;
  block_tensors w;
  w.router_w = random_tensor({cfg.n_experts, D}, 3, 0.4f);
  const int count = cfg.n_experts + (cfg.has_shared_expert() ? 1 : 0);
  for (int e = 0; e < count; ++e) {
    const std::int64_t F = expert_width(cfg, e);
    expert_tensors t;
    t.gate_w = random_tensor({F, D}, seed + 3 * static_cast<std::uint64_t>(e), scale);
    t.up_w = random_tensor({F, D}, seed + 3 * static_cast<std::uint64_t>(e) + 1, scale);
    t.down_w = random_tensor({D, F}, seed + 3 * static_cast<std::uint64_t>(e) + 2, scale);
    w.experts.push_back(t);
  }
  if (cfg.has_shared_expert()) w.shared_gate_w = random_tensor({1, D}, seed + 999, 0.5f);
  return w;
}

/// Zero gradients of the roles of `w`.
block_tensors zero_grads(const block_tensors& w) {
  block_tensors g;
  g.router_w = Tensor::zeros(w.router_w.shape());
  for (const expert_tensors& e : w.experts)
    g.experts.push_back({Tensor::zeros(e.gate_w.shape()), Tensor::zeros(e.up_w.shape()), Tensor::zeros(e.down_w.shape()),
                         {}, {}, {}});
  if (w.shared_gate_w.defined()) g.shared_gate_w = Tensor::zeros(w.shared_gate_w.shape());
  return g;
}

// ---- block finite differences ---------------------------------------------------

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

double dot(const Tensor& a, const Tensor& b) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

/// The smallest gap, over rows, between the k-th and (k+1)-th router logit
/// of a forward's routing (infinite when k == E).
double min_topk_margin(const moe_routing& r) {
  double m = 1e300;
  if (r.k == r.experts) return m;
  const float* l = r.logits.data<float>();
  for (std::int64_t t = 0; t < r.rows; ++t) {
    std::vector<float> row(l + t * r.experts, l + (t + 1) * r.experts);
    std::sort(row.rbegin(), row.rend());
    m = std::min(m, static_cast<double>(row[static_cast<std::size_t>(r.k - 1)] - row[static_cast<std::size_t>(r.k)]));
  }
  return m;
}

/// A loss L(parameters) = sum(block(x) * r) that also tells whether the
/// forward routed every row as the unperturbed one did.
struct routed_loss {
  std::function<double()> loss;
  bool rerouted = false;
};

/// <grad, d> against the fourth-order central difference of the loss along
/// a random direction d of `target` (restored afterwards), as
/// test_block.cpp's check. Perturbations that reroute a row are not
/// compared: the next direction is tried (a few at most).
void check_direction_routed(const std::string& what, Tensor target, const Tensor& grad, routed_loss& l,
                            std::uint64_t seed, double h = 4e-3) {
  Tensor saved = target.clone();
  float* p = target.data<float>();
  const float* s = saved.data<float>();
  for (int attempt = 0; attempt < 6; ++attempt) {
    const Tensor d = random_tensor(target.shape(), seed + 1000 * static_cast<std::uint64_t>(attempt));
    const float* dv = d.data<float>();
    l.rerouted = false;
    auto at = [&](double step) {
      for (std::int64_t i = 0; i < target.numel(); ++i) p[i] = s[i] + static_cast<float>(step) * dv[i];
      return l.loss();
    };
    const double numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    target.copy_from(saved);
    if (l.rerouted) continue;  // a jump in the loss, not a derivative: another direction
    const double analytic = dot(grad, d);
    INFO(what << ": analytic " << analytic << ", numeric " << numeric << " (direction " << attempt << ")");
    CHECK(std::abs(analytic - numeric) <= 5e-3 * std::max(1.0, std::abs(analytic)));
    return;
  }
  FAIL(what << ": every perturbation tried moved a row to another expert");
}

std::vector<std::int32_t> iota_positions(int batch, int seq) {
  std::vector<std::int32_t> pos;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t) pos.push_back(t);
  return pos;
}

void check_moe_block_backward(const model_config& cfg) {
  Backend& be = cpu_backend();
  const int B = 2, T = 5, N = B * T, D = cfg.hidden_size;
  param_set params(block_layout(cfg));
  fill_random(params, 11);
  param_set grads = params.like();
  block_tensors w = block_tensors::of(cfg, params);
  block_tensors g = block_tensors::of(cfg, grads);
  REQUIRE(w.experts.size() == static_cast<std::size_t>(cfg.n_experts + (cfg.has_shared_expert() ? 1 : 0)));
  const auto pos_v = iota_positions(B, T);
  Tensor pos = Tensor::from_i32(pos_v, {N});
  Tensor r = random_tensor({N, D}, 6);  // L = sum(y * r), so dL/dy = r

  // An input whose rows are routed with clear margins and reach every expert
  // (so that every expert's gradient is exercised).
  Tensor x;
  block_activations acts;
  Tensor y = Tensor::empty({N, D});
  double margin = 0;
  for (std::uint64_t seed = 5;; ++seed) {
    if (seed > 60) FAIL("no input seed routes every row with a margin of 0.1 to every expert");
    x = random_tensor({N, D}, seed);
    block_forward(be, cfg, w, x, pos, B, T, y, acts);
    const moe_routing& route = acts.moe.route;
    bool every_expert = true;
    for (int e = 0; e < cfg.n_experts; ++e) every_expert = every_expert && route.offsets[e + 1] > route.offsets[e];
    margin = min_topk_margin(route);
    if (every_expert && margin >= 0.1) break;
  }
  INFO("smallest top-k router logit margin: " << margin);
  const std::vector<std::int32_t> base_route = acts.moe.route.chosen;

  routed_loss l;
  l.loss = [&] {
    block_activations a;
    Tensor out = Tensor::empty({N, D});
    block_forward(be, cfg, w, x, pos, B, T, out, a);
    if (a.moe.route.chosen != base_route) l.rerouted = true;
    return dot(out, r);
  };
  Tensor dx = Tensor::empty({N, D});
  block_grad_scratch scratch;
  block_backward(be, cfg, w, acts, pos, r, dx, g, scratch);

  check_direction_routed("x", x, dx, l, 100);
  // The input-only backward (frozen weights) gives the same dx.
  {
    Tensor dx_only = Tensor::empty({N, D});
    block_grad_scratch input_scratch;
    block_backward_input(be, cfg, w, acts, pos, r, dx_only, input_scratch);
    CHECK(testing::max_abs_diff(dx_only.to_vector(), dx.to_vector()) < 1e-5);
  }
  std::uint64_t seed = 200;
  int experts_checked = 0, shared_checked = 0;
  for (const auto& e : params.entries()) {
    check_direction_routed(e.name, params.get(e.name), grads.get(e.name), l, seed++);
    if (e.name.rfind("experts.", 0) == 0) ++experts_checked;
    if (e.name.rfind("shared", 0) == 0) ++shared_checked;
  }
  CHECK(experts_checked == 3 * cfg.n_experts);
  CHECK(shared_checked == (cfg.has_shared_expert() ? 4 : 0));
  // The router's gradient is not zero (unless top-1 renormalised: every weight is 1).
  const bool router_constant = cfg.experts_per_token == 1 && cfg.norm_topk_prob;
  double router_norm = 0;
  for (float v : grads.get("router.weight").to_vector()) router_norm += double(v) * v;
  if (router_constant)
    CHECK(router_norm == 0.0);
  else
    CHECK(router_norm > 1e-6);

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

}  // namespace


TEST_CASE("moe_forward equals a float64 loop of HF's sparse MoE block, for many rows and for one") {
  Backend& be = cpu_backend();
  struct variant {
    const char* family;
    int experts, k;
    bool norm;
  };
  for (const variant& v : {variant{"MixtralForCausalLM", 4, 2, true}, variant{"Qwen3MoeForCausalLM", 6, 3, false},
                           variant{"Qwen3MoeForCausalLM", 4, 1, false}, variant{"MixtralForCausalLM", 3, 3, true},
                           variant{"Qwen2MoeForCausalLM", 4, 2, false}, variant{"Qwen2MoeForCausalLM", 5, 1, true}}) {
    CAPTURE(v.family);
    CAPTURE(v.k);
    const model_config cfg = moe_config(v.family, v.experts, v.k, v.norm);
    const std::int64_t D = cfg.hidden_size;
    const block_tensors w = random_moe(cfg, 10);
    moe_buffers b;  // reused across the row counts, as a decode workspace is
    for (std::int64_t n : {33, 1, 7}) {
      CAPTURE(n);
      const Tensor x = random_tensor({n, D}, 50 + static_cast<std::uint64_t>(n));
      Tensor y = Tensor::empty({n, D});
      moe_forward(be, cfg, w, x, y, b);
      double margin = 0;
      const std::vector<double> want = reference_moe(cfg, w, x, margin);
      INFO("smallest top-k logit margin " << margin);
      REQUIRE(margin > 1e-4);  // far from a tie: f32 and f64 choose alike
      const std::vector<float> got = y.to_vector();
      double worst = 0;
      for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(want[i] - got[i]));
      CHECK(worst < 1e-5);
      CHECK(b.route.rows == n);
      check_routing_consistent(b.route, n, cfg.n_experts, cfg.experts_per_token);
    }
  }
  // Experts of the wrong count are refused; a shared expert counts.
  const model_config cfg = moe_config("MixtralForCausalLM", 4, 2, true);
  block_tensors three;
  three.router_w = random_tensor({4, 16}, 3);
  three.experts.resize(3);
  const Tensor x = random_tensor({2, 16}, 4);
  Tensor y = Tensor::empty({2, 16});
  moe_buffers b;
  CHECK_THROWS_WITH_AS(moe_forward(be, cfg, three, x, y, b), doctest::Contains("3 experts for a config with 4"),
                       tensor_error);
  const model_config shared = moe_config("Qwen2MoeForCausalLM", 4, 2, true);
  block_tensors four = random_moe(shared, 10);
  four.experts.pop_back();  // the shared expert missing
  CHECK_THROWS_WITH_AS(moe_forward(be, shared, four, x, y, b),
                       doctest::Contains("4 experts for a config with 4 and a shared expert"), tensor_error);
}

TEST_CASE("mixtral block backward (top-2, renormalised, GQA) matches finite differences") {
  check_moe_block_backward(moe_config("MixtralForCausalLM", 4, 2, true));
}

TEST_CASE("qwen3-moe block backward (top-2, not renormalised, q/k norms, biases) matches finite differences") {
  check_moe_block_backward(moe_config("Qwen3MoeForCausalLM", 4, 2, false));
}

TEST_CASE("qwen3-moe block backward with top-1 routing, renormalised or not, matches finite differences") {
  check_moe_block_backward(moe_config("Qwen3MoeForCausalLM", 4, 1, false));
  check_moe_block_backward(moe_config("Qwen3MoeForCausalLM", 4, 1, true));  // every weight 1: no router gradient
}

TEST_CASE("qwen2-moe block backward (top-2, q/k/v biases, a gated shared expert) matches finite differences") {
  check_moe_block_backward(moe_config("Qwen2MoeForCausalLM", 4, 2, false));
  check_moe_block_backward(moe_config("Qwen2MoeForCausalLM", 3, 1, true));
}

TEST_CASE("mixtral block backward with top-3 of 5 experts matches finite differences") {
  check_moe_block_backward(moe_config("MixtralForCausalLM", 5, 3, true));
}

TEST_CASE("moe block layouts: a router and each expert's gate, up and down in place of the dense MLP") {
  const model_config cfg = moe_config("MixtralForCausalLM", 3, 2, true);
  const auto layout = block_layout(cfg);
  std::vector<std::string> names;
  for (const auto& [name, shape] : layout) names.push_back(name);
  for (const char* dense : {"gate.weight", "up.weight", "down.weight"})
    CHECK(std::find(names.begin(), names.end(), dense) == names.end());
  auto shape_of = [&](const std::string& name) {
    for (const auto& [n, s] : layout)
      if (n == name) return s;
    FAIL("no tensor " << name << " in the layout");
    return shape_t{};
  };
  CHECK(shape_of("router.weight") == shape_t{3, 16});
  for (int e = 0; e < 3; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    CHECK(shape_of(p + "gate.weight") == shape_t{24, 16});
    CHECK(shape_of(p + "up.weight") == shape_t{24, 16});
    CHECK(shape_of(p + "down.weight") == shape_t{16, 24});
  }
  long long total = 0;
  for (const auto& [name, shape] : layout) total += shape_numel(shape);
  // The block's share of parameter_count: everything but embeddings, head and final norm.
  const long long head = static_cast<long long>(cfg.vocab_size) * cfg.hidden_size * (cfg.tie_embeddings ? 1 : 2) +
                         cfg.hidden_size;
  CHECK(total * cfg.n_layers + head == cfg.parameter_count());

  // Qwen2-MoE adds its shared expert (its own width) and the shared expert's gate.
  const model_config q = moe_config("Qwen2MoeForCausalLM", 3, 2, false);
  REQUIRE(q.shared_expert_size == 20);
  const auto ql = block_layout(q);
  auto q_shape = [&](const std::string& name) {
    for (const auto& [n, s] : ql)
      if (n == name) return s;
    FAIL("no tensor " << name << " in the Qwen2-MoE layout");
    return shape_t{};
  };
  CHECK(q_shape("shared.gate.weight") == shape_t{20, 16});
  CHECK(q_shape("shared.up.weight") == shape_t{20, 16});
  CHECK(q_shape("shared.down.weight") == shape_t{16, 20});
  CHECK(q_shape("shared_gate.weight") == shape_t{1, 16});
  CHECK(q_shape("q.bias") == shape_t{16});
  long long q_total = 0;
  for (const auto& [name, shape] : ql) q_total += shape_numel(shape);
  const long long q_head = static_cast<long long>(q.vocab_size) * q.hidden_size * (q.tie_embeddings ? 1 : 2) +
                           q.hidden_size;
  CHECK(q_total * q.n_layers + q_head == q.parameter_count());
  CHECK(stored_in_weight_format("shared.down.weight", {16, 20}));
  CHECK_FALSE(stored_in_weight_format("shared_gate.weight", {1, 16}));
  CHECK_FALSE(stored_in_weight_format("router.weight", {3, 16}));
}

TEST_CASE("moe_backward: dx, the router's and every expert's gradients match finite differences") {
  Backend& be = cpu_backend();
  struct variant {
    const char* family;
    int experts, k;
    bool norm;
  };
  for (const variant& v : {variant{"MixtralForCausalLM", 4, 2, true}, variant{"Qwen3MoeForCausalLM", 6, 3, false},
                           variant{"Qwen3MoeForCausalLM", 4, 1, false}, variant{"Qwen2MoeForCausalLM", 4, 2, false}}) {
    CAPTURE(v.family);
    CAPTURE(v.k);
    const model_config cfg = moe_config(v.family, v.experts, v.k, v.norm);
    const std::int64_t N = 9, D = cfg.hidden_size;
    block_tensors w = random_moe(cfg, 60);
    std::vector<expert_tensors>& ex = w.experts;
    const Tensor r = random_tensor({N, D}, 7);  // L = sum(y * r)
    // Rows routed with clear margins, to every expert.
    Tensor x;
    moe_buffers b;
    Tensor y = Tensor::empty({N, D});
    for (std::uint64_t seed = 1;; ++seed) {
      if (seed > 60) FAIL("no input seed routes every row with a margin of 0.1 to every expert");
      x = random_tensor({N, D}, seed);
      moe_forward(be, cfg, w, x, y, b);
      bool every_expert = true;
      for (int e = 0; e < cfg.n_experts; ++e) every_expert = every_expert && b.route.offsets[e + 1] > b.route.offsets[e];
      if (every_expert && min_topk_margin(b.route) >= 0.1) break;
    }
    const std::vector<std::int32_t> base_route = b.route.chosen;

    block_tensors g = zero_grads(w);
    Tensor& drouter = g.router_w;
    std::vector<expert_tensors>& dex = g.experts;
    Tensor dx = Tensor::empty({N, D});
    moe_grad_scratch s;
    moe_backward(be, cfg, w, b, x, r, dx, &g, s);

    routed_loss l;
    l.loss = [&] {
      moe_buffers fresh;
      Tensor out = Tensor::empty({N, D});
      moe_forward(be, cfg, w, x, out, fresh);
      if (fresh.route.chosen != base_route) l.rerouted = true;
      return dot(out, r);
    };
    check_direction_routed("x", x, dx, l, 100);
    check_direction_routed("router", w.router_w, drouter, l, 101);
    if (cfg.has_shared_expert()) check_direction_routed("shared expert gate", w.shared_gate_w, g.shared_gate_w, l, 102);
    for (std::size_t e = 0; e < ex.size(); ++e) {  // the shared expert last
      const std::string p = "expert " + std::to_string(e) + " ";
      check_direction_routed(p + "gate", ex[e].gate_w, dex[e].gate_w, l, 110 + 3 * e);
      check_direction_routed(p + "up", ex[e].up_w, dex[e].up_w, l, 111 + 3 * e);
      check_direction_routed(p + "down", ex[e].down_w, dex[e].down_w, l, 112 + 3 * e);
    }
    // The router's part of dx is not negligible (the check above can see it):
    // dx without it, dy through the experts alone, differs.
    {
      const std::vector<float> dl = s.dlogits_host.to_vector();
      double router_part = 0;
      for (float g : dl) router_part = std::max(router_part, static_cast<double>(std::abs(g)));
      CHECK(router_part > 1e-2);
    }

    // Frozen weights: the same dx from the input-only backward, whose
    // scratch is its own.
    Tensor dx_only = Tensor::empty({N, D});
    moe_grad_scratch frozen;
    moe_backward(be, cfg, w, b, x, r, dx_only, nullptr, frozen);
    CHECK(testing::max_abs_diff(dx_only.to_vector(), dx.to_vector()) < 1e-5);

    // Gradients add: a second backward doubles them.
    const std::vector<float> once = drouter.to_vector(), once_down = dex[0].down_w.to_vector();
    moe_backward(be, cfg, w, b, x, r, dx, &g, s);
    const std::vector<float> twice = drouter.to_vector(), twice_down = dex[0].down_w.to_vector();
    for (std::size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]).epsilon(1e-5));
    for (std::size_t i = 0; i < once_down.size(); ++i)
      CHECK(twice_down[i] == doctest::Approx(2 * once_down[i]).epsilon(1e-5));
  }
}

TEST_CASE("inference weights of a moe block convert every expert, keep the router f32, and take served_block_bytes, and 16-bit compute copies too") {
  Backend& be = cpu_backend();
  for (const char* family : {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"}) {
    CAPTURE(family);
    const model_config cfg = moe_config(family, 3, 2, true, 16, 64);
    param_set params(block_layout(cfg));
    fill_random(params, 13);
    const block_tensors w = block_tensors::of(cfg, params);
    std::int64_t f32_bytes = 0;  // the parameters themselves (the flat buffer may pad between them)
    for (const auto& e : params.entries()) f32_bytes += 4 * e.numel;
    for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      const std::string format = weight_format_name(f);
      CAPTURE(format);
      const block_tensors iw = inference_weights(be, w, f);
      CHECK(iw.format == f);
      // The router is the f32 parameter itself.
      CHECK(iw.router_w.raw() == w.router_w.raw());
      CHECK(iw.router_w.type() == dtype::f32);
      REQUIRE(iw.experts.size() == (cfg.has_shared_expert() ? 4U : 3U));
      // So is the shared expert's gate.
      CHECK(iw.shared_gate_w.defined() == cfg.has_shared_expert());
      if (cfg.has_shared_expert()) CHECK(iw.shared_gate_w.raw() == w.shared_gate_w.raw());
      std::int64_t copies = 0;
      auto bytes = [&](const Tensor& t) { copies += t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0; };
      for (const Tensor* t : {&iw.qkv_w, &iw.qkv_s, &iw.qkv_b, &iw.o_w, &iw.o_s}) bytes(*t);
      for (std::size_t e = 0; e < iw.experts.size(); ++e) {  // the shared expert's too
        const expert_tensors& x = iw.experts[e];
        for (const Tensor* t : {&x.gate_w, &x.up_w, &x.down_w}) {
          CHECK(t->type() == (f == weight_format::bf16 ? dtype::bf16 : dtype::i8));
          CHECK(t->dim(0) == w.experts[e].gate_w.dim(t == &x.down_w ? 1 : 0));
          CHECK(t->raw() != w.experts[e].gate_w.raw());
          if (f == weight_format::bf16) CHECK(t->shape() == (t == &x.down_w ? w.experts[e].down_w : w.experts[e].gate_w).shape());
        }
        CHECK(x.gate_s.defined() == is_quantized(f));
        for (const Tensor* t : {&x.gate_w, &x.up_w, &x.down_w, &x.gate_s, &x.up_s, &x.down_s}) bytes(*t);
        // The f32 parameters stay as they were.
        CHECK(w.experts[e].gate_w.type() == dtype::f32);
      }
      CHECK(served_block_bytes(cfg, f) == f32_bytes + copies);
    }
    CHECK(served_block_bytes(cfg, weight_format::f32) == f32_bytes);
    // Mixed-precision compute copies: every expert's gate, up and down in
    // 16 bits (filled by copy_linear_weights), the router and the shared
    // gate the f32 parameters themselves.
    for (dtype t : {dtype::bf16, dtype::f16}) {
      CAPTURE(dtype_name(t));
      block_tensors cw = compute_weights_like(be, w, t);
      CHECK(cw.router_w.raw() == w.router_w.raw());
      if (cfg.has_shared_expert()) CHECK(cw.shared_gate_w.raw() == w.shared_gate_w.raw());
      REQUIRE(cw.experts.size() == w.experts.size());
      copy_linear_weights(be, w, cw);
      for (std::size_t e = 0; e < cw.experts.size(); ++e)
        for (auto role : {&expert_tensors::gate_w, &expert_tensors::up_w, &expert_tensors::down_w}) {
          const Tensor& c = cw.experts[e].*role;
          const Tensor& p = w.experts[e].*role;
          CHECK(c.type() == t);
          CHECK(c.shape() == p.shape());
          CHECK(c.raw() != p.raw());
          CHECK(c.to(dtype::f32).to_vector() == p.to(t).to(dtype::f32).to_vector());
        }
      block_tensors fewer = cw;
      fewer.experts.pop_back();
      CHECK_THROWS_WITH_AS(copy_linear_weights(be, w, fewer), doctest::Contains("experts into"), tensor_error);
    }
  }
}
