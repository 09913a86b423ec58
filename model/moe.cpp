// model/moe.cpp — the mixture-of-experts MLP (see model/moe.hpp).
#include "model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "model/block.hpp"
#include "model/workspace.hpp"

namespace corolla {
namespace {

/// Makes `t` a host tensor of exactly `shape` and `type`, reusing it when it is one already.
Tensor& ensure_host(Tensor& t, const shape_t& shape, dtype type = dtype::f32) {
  if (!t.defined() || t.shape() != shape || t.type() != type || t.dev().kind != device_kind::cpu)
    t = Tensor::empty(shape, type);
  return t;
}

/// ensure_host for the decode path ([rows, width], or [rows] with width <
/// 0): builds a shape only when it allocates.
Tensor& host_rows(Tensor& t, std::int64_t rows, std::int64_t width, dtype type = dtype::f32) {
  const bool same = t.defined() && t.type() == type && t.dev().kind == device_kind::cpu &&
                    (width < 0 ? t.shape().size() == 1 && t.shape()[0] == rows : has_rows(t, rows, width));
  if (same) return t;
  return ensure_host(t, width < 0 ? shape_t{rows} : shape_t{rows, width}, type);
}

/// The rows [o0, o1) of expert-sorted buffers, as views.
struct expert_rows {
  std::int64_t begin, end;
  Tensor of(const Tensor& t) const { return t.slice(begin, end); }
};

/// Throws unless `n` is the number of experts a block of `cfg` holds (the
/// shared expert included).
void check_experts(const model_config& cfg, std::size_t n, const char* what) {
  const int want = cfg.n_experts + (cfg.has_shared_expert() ? 1 : 0);
  if (!cfg.is_moe() || static_cast<int>(n) != want)
    throw tensor_error(std::string(what) + ": " + std::to_string(n) + " experts for a config with " +
                       std::to_string(cfg.n_experts) + (cfg.has_shared_expert() ? " and a shared expert" : ""));
}

}  // namespace

void route_rows(int k, bool renormalise, moe_routing& r) {
  const Tensor& logits = r.logits;
  if (!logits.defined() || logits.rank() != 2 || logits.type() != dtype::f32)
    throw tensor_error("route_rows: the logits must be a host f32 [N, E] tensor");
  const std::int64_t n = logits.dim(0);
  const int e_count = static_cast<int>(logits.dim(1));
  if (k < 1 || k > e_count)
    throw tensor_error("route_rows: " + std::to_string(k) + " experts per row of " + std::to_string(e_count));
  const std::int64_t m = n * k;
  r.rows = n;
  r.k = k;
  r.experts = e_count;
  r.renormalised = renormalise;
  r.probs.resize(static_cast<std::size_t>(n * e_count));
  r.chosen.resize(static_cast<std::size_t>(m));
  r.offsets.assign(static_cast<std::size_t>(e_count) + 1, 0);
  float* w = host_rows(r.weights_host, n, k).data<float>();
  std::int32_t* slots = host_rows(r.slots, n, k, dtype::i32).data<std::int32_t>();
  std::int32_t* sorted = host_rows(r.sorted_rows, m, -1, dtype::i32).data<std::int32_t>();
  float* row_w = host_rows(r.row_weights_host, m, -1).data<float>();
  const float* l = logits.data<float>();
  for (std::int64_t t = 0; t < n; ++t) {
    // Softmax over the experts (in double, rounded once to f32 as HF's f32 softmax).
    const float* row = l + t * e_count;
    float* p = r.probs.data() + t * e_count;
    double top = row[0];
    for (int e = 1; e < e_count; ++e) top = std::fmax(top, static_cast<double>(row[e]));
    double sum = 0;
    for (int e = 0; e < e_count; ++e) sum += std::exp(static_cast<double>(row[e]) - top);
    for (int e = 0; e < e_count; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(row[e]) - top) / sum);
    // Top-k by repeated selection (E is small), largest first, ties to the lower index.
    std::int32_t* pick = r.chosen.data() + t * k;
    float chosen_sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < e_count; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || pick[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      pick[j] = best;
      w[t * k + j] = p[best];
      chosen_sum += p[best];
      ++r.offsets[static_cast<std::size_t>(best) + 1];
    }
    if (renormalise)
      for (int j = 0; j < k; ++j) w[t * k + j] /= chosen_sum;
  }
  for (int e = 0; e < e_count; ++e) r.offsets[e + 1] += r.offsets[e];
  // Counting sort by expert: within an expert, rows keep their order.
  // offsets[e] serves as expert e's cursor (no scratch to allocate per
  // step) and ends at expert e's end, offsets[e + 1]: shifted back after.
  for (std::int64_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) {
      const std::int64_t at = r.offsets[static_cast<std::size_t>(r.chosen[t * k + j])]++;
      slots[t * k + j] = static_cast<std::int32_t>(at);
      sorted[at] = static_cast<std::int32_t>(t);
      row_w[at] = w[t * k + j];
    }
  for (int e = e_count; e > 0; --e) r.offsets[static_cast<std::size_t>(e)] = r.offsets[static_cast<std::size_t>(e) - 1];
  r.offsets[0] = 0;
}

float routing_margin(const moe_routing& r, std::int64_t t) {
  if (r.k >= r.experts) return INFINITY;
  const float* row = r.logits.data<float>() + t * r.experts;
  const std::int32_t* pick = r.chosen.data() + t * r.k;
  float lo = row[0], hi = row[0], best_unchosen = -INFINITY;
  for (int e = 0; e < r.experts; ++e) {
    lo = std::min(lo, row[e]);
    hi = std::max(hi, row[e]);
    if (std::find(pick, pick + r.k, e) == pick + r.k) best_unchosen = std::max(best_unchosen, row[e]);
  }
  const float spread = hi - lo;
  if (!(spread > 0)) return 0.0f;
  // The k-th choice is the smallest chosen logit (largest probability first).
  return (row[pick[r.k - 1]] - best_unchosen) / spread;
}

void route_rows_backward(const moe_routing& r, const Tensor& dweights, Tensor& dlogits) {
  const std::int64_t n = r.rows;
  const int k = r.k, e_count = r.experts;
  expect_shape(dweights, {n, k}, "route_rows_backward dweights");
  expect_shape(dlogits, {n, e_count}, "route_rows_backward dlogits");
  const float* dw = dweights.data<float>();
  float* dl = dlogits.data<float>();
  std::vector<double> dp(static_cast<std::size_t>(k));
  for (std::int64_t t = 0; t < n; ++t) {
    const float* p = r.probs.data() + t * e_count;
    const std::int32_t* pick = r.chosen.data() + t * k;
    // Through the renormalisation w_j = p_j / S, S = sum_i p_i:
    // dL/dp_j = (dw_j - sum_i dw_i w_i) / S.
    double s = 0, dot = 0;
    for (int j = 0; j < k; ++j) s += p[pick[j]];
    for (int j = 0; j < k; ++j) dot += static_cast<double>(dw[t * k + j]) * p[pick[j]] / s;
    for (int j = 0; j < k; ++j) dp[j] = r.renormalised ? (dw[t * k + j] - dot) / s : dw[t * k + j];
    // Through the softmax: dL/dl_e = p_e (dL/dp_e - sum_f p_f dL/dp_f),
    // where only the chosen experts have a dL/dp.
    double pdp = 0;
    for (int j = 0; j < k; ++j) pdp += p[pick[j]] * dp[j];
    float* out = dl + t * e_count;
    for (int e = 0; e < e_count; ++e) out[e] = static_cast<float>(-p[e] * pdp);
    for (int j = 0; j < k; ++j) out[pick[j]] = static_cast<float>(p[pick[j]] * (dp[j] - pdp));
  }
}

namespace {

/// The input of the router and the shared gate, which stay f32: x itself,
/// or x widened into b.x32 (16-bit activations).
const Tensor& router_input(Backend& be, const Tensor& x, moe_buffers& b) {
  if (x.type() == dtype::f32) return x;
  be.copy(x, ensure_rows(be, b.x32, x.dim(0), x.dim(1)));
  return b.x32;
}

/// dx += dz @ w for an f32 weight (the router's, the shared gate's) and its
/// f32 output gradient dz: straight into an f32 dx, else computed in f32
/// and rounded once before the sum.
void add_input_grad(Backend& be, const Tensor& dz, const Tensor& w, Tensor& dx, moe_grad_scratch& s) {
  if (dx.type() == dtype::f32) return be.gemm(dz, false, w, false, dx, 1.0f, 1.0f);
  const std::int64_t n = dx.dim(0), d = dx.dim(1);
  be.gemm(dz, false, w, false, ensure_rows(be, s.dx32, n, d));
  be.copy(s.dx32, ensure_rows(be, s.dx16, n, d, dx.type()));
  be.add(dx, s.dx16, dx);
}

/// One SwiGLU expert over the rows x: gate, up and act kept for the
/// backward, y written.
void expert_forward(Backend& be, weight_format f, const expert_tensors& ex, const Tensor& x, Tensor& gate, Tensor& up,
                    Tensor& act, Tensor& y) {
  linear_as(be, f, x, ex.gate_w, ex.gate_s, nullptr, gate);
  linear_as(be, f, x, ex.up_w, ex.up_s, nullptr, up);
  be.swiglu(gate, up, act);
  linear_as(be, f, act, ex.down_w, ex.down_s, nullptr, y);
}

/// Its backward: dx overwritten from dy (with expert_forward's x, gate, up
/// and act); the weights' gradients added into `g` when given (f32
/// weights), else frozen weights.
void expert_backward(Backend& be, const expert_tensors& ex, const Tensor& x, const Tensor& gate, const Tensor& up,
                     const Tensor& act, const Tensor& dy, Tensor& dact, Tensor& dgate, Tensor& dup, Tensor& dx,
                     expert_tensors* g) {
  if (g) {
    be.linear_backward(act, ex.down_w, dy, &dact, g->down_w, nullptr);
    be.swiglu_backward(gate, up, dact, dgate, dup);
    be.linear_backward(x, ex.gate_w, dgate, &dx, g->gate_w, nullptr);
    be.linear_backward(x, ex.up_w, dup, nullptr, g->up_w, nullptr);
  } else {
    // Frozen weights: activation gradients are plain products, d(in) = d(out) @ W.
    be.gemm(dy, false, ex.down_w, false, dact);
    be.swiglu_backward(gate, up, dact, dgate, dup);
    be.gemm(dgate, false, ex.gate_w, false, dx);
  }
  be.gemm(dup, false, ex.up_w, false, dx, 1.0f, 1.0f);  // dx += dup @ W_up
}

/// Expert e of `w` (n_experts: the shared expert) as its block computes:
/// itself, or, stored in another format than the block's (a frozen block,
/// block_tensors::expert_scratch), widened to f32 into the scratch, which
/// the next call reuses.
const expert_tensors& expert_in_use(Backend& be, const model_config& cfg, const block_tensors& w, int e) {
  const expert_tensors& ex = w.experts[static_cast<std::size_t>(e)];
  if (ex.format == w.format) return ex;
  if (w.format != weight_format::f32 || !w.expert_scratch)
    throw tensor_error("moe: expert " + std::to_string(e) + " is stored as " + weight_format_name(ex.format) +
                       " in a block of " + weight_format_name(w.format) + " weights (only a frozen f32 block widens "
                       "its experts on use)");
  widen_expert_weights(be, cfg, e, ex, *w.expert_scratch);
  return *w.expert_scratch;
}

/// The rows 0..n-1 (host i32 [n]): the shared expert's routing.
const Tensor& identity_rows(moe_buffers& b, std::int64_t n) {
  Tensor& t = host_rows(b.identity, n, -1, dtype::i32);
  std::int32_t* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(i);
  return t;
}

/// y += sigmoid(shared_gate(x)) * shared(x), row by row (Qwen2-MoE).
void shared_expert_forward(Backend& be, const model_config& cfg, const block_tensors& w, const Tensor& x, Tensor& y,
                           moe_buffers& b) {
  const std::int64_t n = x.dim(0), S = cfg.shared_expert_size;
  const dtype act = x.type();
  ensure_rows(be, b.shared_logit, n, 1);
  be.linear(act == dtype::f32 ? x : b.x32, w.shared_gate_w, nullptr, b.shared_logit);
  Tensor& gate = host_rows(b.shared_w_host, n, 1);
  be.copy(b.shared_logit, gate);
  float* g = gate.data<float>();
  for (std::int64_t t = 0; t < n; ++t) g[t] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(g[t]))));
  be.copy(gate, ensure_rows(be, b.shared_w, n, 1));
  expert_forward(be, w.format, expert_in_use(be, cfg, w, cfg.n_experts), x,
                 ensure_rows(be, b.sgate, n, S, act), ensure_rows(be, b.sup, n, S, act),
                 ensure_rows(be, b.sact, n, S, act), ensure_rows(be, b.sy, n, x.dim(1), act));
  be.moe_combine(b.sy, identity_rows(b, n).view({n, 1}), &b.shared_w, true, y);
}

/// Its backward: dx += the shared expert's and its gate's input gradients;
/// with `g`, their weights' gradients added.
void shared_expert_backward(Backend& be, const model_config& cfg, const block_tensors& w, const moe_buffers& b,
                            const Tensor& x, const Tensor& dy, Tensor& dx, block_tensors* g, moe_grad_scratch& s) {
  const std::int64_t n = x.dim(0), d = x.dim(1), S = cfg.shared_expert_size;
  const dtype act = x.type();
  const Tensor slots = b.identity.view({n, 1});
  // dL/dgate_t = dot(dy_t, shared_t), then through the sigmoid: z = the
  // gate's logit, dL/dz = dL/dgate * g (1 - g).
  be.moe_combine_weight_grad(dy, b.sy, slots, ensure_tensor(be, s.dshared_w, {n, 1}));
  Tensor& dz = ensure_host(s.dshared_w_host, {n, 1});
  be.copy(s.dshared_w, dz);
  float* dzp = dz.data<float>();
  const float* gp = b.shared_w_host.data<float>();
  for (std::int64_t t = 0; t < n; ++t) dzp[t] *= gp[t] * (1.0f - gp[t]);
  be.copy(dz, ensure_tensor(be, s.dshared_z, {n, 1}));
  // The shared expert's output rows' gradient: dy scaled by each row's gate.
  const Tensor row_gates = b.shared_w.view({n});
  be.moe_gather(dy, b.identity, &row_gates, ensure_tensor(be, s.dsy, {n, d}, act));
  expert_backward(be, expert_in_use(be, cfg, w, cfg.n_experts), x, b.sgate, b.sup, b.sact, s.dsy,
                  ensure_tensor(be, s.dsact, {n, S}, act), ensure_tensor(be, s.dsgate, {n, S}, act),
                  ensure_tensor(be, s.dsup, {n, S}, act), ensure_tensor(be, s.dsx, {n, d}, act),
                  g ? &g->experts[static_cast<std::size_t>(cfg.n_experts)] : nullptr);
  be.moe_combine(s.dsx, slots, nullptr, true, dx);
  if (g) be.linear_backward(act == dtype::f32 ? x : b.x32, w.shared_gate_w, s.dshared_z, nullptr, g->shared_gate_w,
                            nullptr);
  add_input_grad(be, s.dshared_z, w.shared_gate_w, dx, s);
}

}  // namespace

void moe_forward(Backend& be, const model_config& cfg, const block_tensors& w, const Tensor& x, Tensor& y,
                 moe_buffers& b) {
  check_experts(cfg, w.experts.size(), "moe_forward");
  const std::int64_t n = x.dim(0), d = cfg.hidden_size, ff = cfg.intermediate_size;
  const int k = cfg.experts_per_token;
  const std::int64_t m = n * k;
  // Nothing here allocates once the shapes repeat (a decode step).
  expect_rows(x, n, d, "moe_forward x");
  expect_rows(y, n, d, "moe_forward y");
  // Activations take x's dtype (f32, or 16-bit in mixed precision).
  const dtype act = x.type();
  expect_dtype(y, act, "moe_forward y");
  ensure_rows(be, b.logits, n, cfg.n_experts);
  be.linear(router_input(be, x, b), w.router_w, nullptr, b.logits);
  moe_routing& r = b.route;
  be.copy(b.logits, host_rows(r.logits, n, cfg.n_experts));
  route_rows(k, cfg.norm_topk_prob, r);
  be.copy(r.weights_host, ensure_rows(be, r.weights, n, k));
  ensure_rows(be, b.xs, m, d, act);
  ensure_rows(be, b.gate, m, ff, act);
  ensure_rows(be, b.up, m, ff, act);
  ensure_rows(be, b.act, m, ff, act);
  ensure_rows(be, b.ys, m, d, act);
  be.moe_gather(x, r.sorted_rows, nullptr, b.xs);
  for (int e = 0; e < cfg.n_experts; ++e) {
    const std::int64_t begin = r.offsets[e], end = r.offsets[e + 1];
    if (begin == end) continue;  // no row chose this expert
    b.xs.slice_into(begin, end, b.xe);
    b.gate.slice_into(begin, end, b.ge);
    b.up.slice_into(begin, end, b.ue);
    b.act.slice_into(begin, end, b.ae);
    b.ys.slice_into(begin, end, b.ye);
    expert_forward(be, w.format, expert_in_use(be, cfg, w, e), b.xe, b.ge, b.ue, b.ae, b.ye);
  }
  be.moe_combine(b.ys, r.slots, &r.weights, false, y);
  if (cfg.has_shared_expert()) shared_expert_forward(be, cfg, w, x, y, b);
}

void moe_backward(Backend& be, const model_config& cfg, const block_tensors& w, const moe_buffers& b, const Tensor& x,
                  const Tensor& dy, Tensor& dx, block_tensors* g, moe_grad_scratch& s) {
  check_experts(cfg, w.experts.size(), "moe_backward");
  if (g) check_experts(cfg, g->experts.size(), "moe_backward gradients");
  const moe_routing& r = b.route;
  const std::int64_t n = r.rows, d = cfg.hidden_size, ff = cfg.intermediate_size;
  const int k = r.k;
  const std::int64_t m = n * k;
  expect_shape(dy, {n, d}, "moe_backward dy");
  expect_shape(dx, {n, d}, "moe_backward dx");
  // Activation gradients take the activations' dtype; the routing weights'
  // and the parameters' gradients are f32.
  const dtype act = x.type();
  expect_dtype(dy, act, "moe_backward dy");
  expect_dtype(dx, act, "moe_backward dx");
  // The routing weights' gradient, then the router logits' (on the host).
  be.moe_combine_weight_grad(dy, b.ys, r.slots, ensure_tensor(be, s.dweights, {n, k}));
  be.copy(s.dweights, ensure_host(s.dweights_host, {n, k}));
  route_rows_backward(r, s.dweights_host, ensure_host(s.dlogits_host, {n, cfg.n_experts}));
  be.copy(s.dlogits_host, ensure_tensor(be, s.dlogits, {n, cfg.n_experts}));
  // Each expert output row's gradient is its row's dy times its weight.
  Tensor& row_w = ensure_tensor(be, s.row_weights, {m});
  be.copy(r.row_weights_host, row_w);
  ensure_tensor(be, s.dys, {m, d}, act);
  ensure_tensor(be, s.dact, {m, ff}, act);
  ensure_tensor(be, s.dgate, {m, ff}, act);
  ensure_tensor(be, s.dup, {m, ff}, act);
  ensure_tensor(be, s.dxs, {m, d}, act);
  be.moe_gather(dy, r.sorted_rows, &row_w, s.dys);
  for (int e = 0; e < cfg.n_experts; ++e) {
    const expert_rows rows{r.offsets[e], r.offsets[e + 1]};
    if (rows.begin == rows.end) continue;
    Tensor dae = rows.of(s.dact), dge = rows.of(s.dgate), due = rows.of(s.dup), dxe = rows.of(s.dxs);
    expert_backward(be, expert_in_use(be, cfg, w, e), rows.of(b.xs), rows.of(b.gate), rows.of(b.up),
                    rows.of(b.act), rows.of(s.dys), dae, dge, due, dxe,
                    g ? &g->experts[static_cast<std::size_t>(e)] : nullptr);
  }
  // dx: each row's k expert input gradients, plus the router's.
  be.moe_combine(s.dxs, r.slots, nullptr, false, dx);
  if (g) be.linear_backward(act == dtype::f32 ? x : b.x32, w.router_w, s.dlogits, nullptr, g->router_w, nullptr);
  add_input_grad(be, s.dlogits, w.router_w, dx, s);
  if (cfg.has_shared_expert()) shared_expert_backward(be, cfg, w, b, x, dy, dx, g, s);
}

}  // namespace corolla
