// tests/model/gpt2_reference.hpp — an independent float64 GPT-2 with a
// hand-written backward pass and torch's AdamW, used to check corolla's
// training numerics. Written from the HuggingFace GPT2LMHeadModel definition
// (Conv1D weights are [in, out]; y = x @ W + b), with nothing shared with the
// library but the checkpoint it reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace corolla::testing::ref {

using vec = std::vector<double>;

/// One transformer block's parameters (HF names in the comments).
struct gpt2_layer {
  vec ln1_w, ln1_b;      ///< ln_1.weight/bias [D]
  vec attn_w, attn_b;    ///< attn.c_attn.weight [D, 3D] / bias [3D]
  vec proj_w, proj_b;    ///< attn.c_proj.weight [D, D] / bias [D]
  vec ln2_w, ln2_b;      ///< ln_2.weight/bias [D]
  vec fc_w, fc_b;        ///< mlp.c_fc.weight [D, F] / bias [F]
  vec fcproj_w, fcproj_b;///< mlp.c_proj.weight [F, D] / bias [D]
};

/// A whole GPT-2 in doubles; also used as its own gradient container.
struct gpt2_model {
  int V = 0, D = 0, P = 0, H = 0, F = 0;
  double eps = 1e-5;
  vec wte, wpe;          ///< [V, D], [P, D]
  vec lnf_w, lnf_b;      ///< ln_f [D]
  vec lm_head;           ///< [V, D]; empty when tied to wte
  std::vector<gpt2_layer> layers;

  /// Every parameter tensor in a fixed order (for the optimiser).
  std::vector<vec*> tensors() {
    std::vector<vec*> r{&wte, &wpe, &lnf_w, &lnf_b};
    if (!lm_head.empty()) r.push_back(&lm_head);
    for (auto& l : layers)
      for (vec* t : {&l.ln1_w, &l.ln1_b, &l.attn_w, &l.attn_b, &l.proj_w, &l.proj_b, &l.ln2_w,
                     &l.ln2_b, &l.fc_w, &l.fc_b, &l.fcproj_w, &l.fcproj_b})
        r.push_back(t);
    return r;
  }
  /// Same shapes, all zeros.
  gpt2_model zeros_like() const {
    gpt2_model z = *this;
    for (vec* t : z.tensors()) std::fill(t->begin(), t->end(), 0.0);
    return z;
  }
};

/// Builds the model from HF tensors (names with or without the
/// "transformer." prefix), n_head and layer_norm_epsilon.
inline gpt2_model from_hf(const std::map<std::string, std::vector<float>>& hf, int n_head,
                          double eps) {
  std::map<std::string, vec> t;
  for (const auto& [name, values] : hf) {
    std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    t[n] = vec(values.begin(), values.end());
  }
  auto take = [&](const std::string& n) {
    auto it = t.find(n);
    if (it == t.end()) throw std::runtime_error("reference: tensor " + n + " missing");
    return it->second;
  };
  gpt2_model m;
  m.eps = eps;
  m.H = n_head;
  m.lnf_w = take("ln_f.weight");
  m.lnf_b = take("ln_f.bias");
  m.D = static_cast<int>(m.lnf_w.size());
  m.wte = take("wte.weight");
  m.wpe = take("wpe.weight");
  m.V = static_cast<int>(m.wte.size()) / m.D;
  m.P = static_cast<int>(m.wpe.size()) / m.D;
  if (t.count("lm_head.weight")) {
    m.lm_head = take("lm_head.weight");
    // A checkpoint may store the tied head explicitly; tied means equal.
    if (m.lm_head == m.wte) m.lm_head.clear();
  }
  for (int i = 0;; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    if (!t.count(p + "ln_1.weight")) break;
    gpt2_layer l;
    l.ln1_w = take(p + "ln_1.weight");
    l.ln1_b = take(p + "ln_1.bias");
    l.attn_w = take(p + "attn.c_attn.weight");
    l.attn_b = take(p + "attn.c_attn.bias");
    l.proj_w = take(p + "attn.c_proj.weight");
    l.proj_b = take(p + "attn.c_proj.bias");
    l.ln2_w = take(p + "ln_2.weight");
    l.ln2_b = take(p + "ln_2.bias");
    l.fc_w = take(p + "mlp.c_fc.weight");
    l.fc_b = take(p + "mlp.c_fc.bias");
    l.fcproj_w = take(p + "mlp.c_proj.weight");
    l.fcproj_b = take(p + "mlp.c_proj.bias");
    m.F = static_cast<int>(l.fc_b.size());
    m.layers.push_back(std::move(l));
  }
  return m;
}

// ---- layers ------------------------------------------------------------------

/// y = (x - mean) * rstd * w + b per row of [T, D].
inline void layernorm(const vec& x, const vec& w, const vec& b, int T, int D, double eps, vec& y,
                      vec& mean, vec& rstd) {
  y.assign(static_cast<std::size_t>(T) * D, 0.0);
  mean.assign(T, 0.0);
  rstd.assign(T, 0.0);
  for (int t = 0; t < T; ++t) {
    const double* xr = &x[static_cast<std::size_t>(t) * D];
    double mu = 0.0;
    for (int i = 0; i < D; ++i) mu += xr[i];
    mu /= D;
    double var = 0.0;
    for (int i = 0; i < D; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    var /= D;  // biased variance, as torch.nn.LayerNorm
    const double rs = 1.0 / std::sqrt(var + eps);
    mean[t] = mu;
    rstd[t] = rs;
    for (int i = 0; i < D; ++i) y[static_cast<std::size_t>(t) * D + i] = (xr[i] - mu) * rs * w[i] + b[i];
  }
}

/// dx += d/dx, dw += , db += of layernorm.
inline void layernorm_backward(const vec& x, const vec& w, const vec& mean, const vec& rstd,
                               const vec& dy, int T, int D, vec& dx, vec& dw, vec& db) {
  for (int t = 0; t < T; ++t) {
    const std::size_t o = static_cast<std::size_t>(t) * D;
    double sum_g = 0.0, sum_gx = 0.0;
    for (int i = 0; i < D; ++i) {
      const double xh = (x[o + i] - mean[t]) * rstd[t];
      const double g = dy[o + i] * w[i];
      sum_g += g;
      sum_gx += g * xh;
      dw[i] += dy[o + i] * xh;
      db[i] += dy[o + i];
    }
    for (int i = 0; i < D; ++i) {
      const double xh = (x[o + i] - mean[t]) * rstd[t];
      const double g = dy[o + i] * w[i];
      dx[o + i] += rstd[t] * (g - sum_g / D - xh * sum_gx / D);
    }
  }
}

/// Conv1D: y[T, out] = x[T, in] @ w[in, out] + b[out].
inline void conv1d(const vec& x, const vec& w, const vec& b, int T, int in, int out, vec& y) {
  y.assign(static_cast<std::size_t>(T) * out, 0.0);
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      double s = b[o];
      for (int i = 0; i < in; ++i)
        s += x[static_cast<std::size_t>(t) * in + i] * w[static_cast<std::size_t>(i) * out + o];
      y[static_cast<std::size_t>(t) * out + o] = s;
    }
}

/// dx = dy @ w^T (overwritten), dw += x^T @ dy, db += column sums of dy.
inline void conv1d_backward(const vec& x, const vec& w, const vec& dy, int T, int in, int out,
                            vec& dx, vec& dw, vec& db) {
  dx.assign(static_cast<std::size_t>(T) * in, 0.0);
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      const double g = dy[static_cast<std::size_t>(t) * out + o];
      db[o] += g;
      for (int i = 0; i < in; ++i) {
        dx[static_cast<std::size_t>(t) * in + i] += g * w[static_cast<std::size_t>(i) * out + o];
        dw[static_cast<std::size_t>(i) * out + o] += g * x[static_cast<std::size_t>(t) * in + i];
      }
    }
}

constexpr double gelu_c = 0.7978845608028654;  // sqrt(2/pi)

inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(gelu_c * (x + 0.044715 * x * x * x)));
}
inline double gelu_grad(double x) {
  const double th = std::tanh(gelu_c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * gelu_c * (1.0 + 3.0 * 0.044715 * x * x);
}

// ---- whole model -----------------------------------------------------------------

/// What one sequence's forward pass keeps for the backward pass.
struct layer_cache {
  vec x, ln1, mean1, rstd1, qkv, att, y, x_mid, ln2, mean2, rstd2, fc, g;
};
struct sequence_cache {
  std::vector<layer_cache> layers;
  vec x_final, xf, meanf, rstdf, probs;
};

/// Forward over one sequence; returns the summed cross-entropy of its T
/// positions and fills `c`.
inline double forward(const gpt2_model& m, const std::int32_t* ids, const std::int32_t* targets,
                      int T, sequence_cache& c) {
  const int D = m.D, V = m.V, H = m.H, F = m.F, Dh = D / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  vec x(static_cast<std::size_t>(T) * D);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D; ++i)
      x[static_cast<std::size_t>(t) * D + i] =
          m.wte[static_cast<std::size_t>(ids[t]) * D + i] + m.wpe[static_cast<std::size_t>(t) * D + i];
  c.layers.assign(m.layers.size(), {});
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const gpt2_layer& p = m.layers[l];
    layer_cache& lc = c.layers[l];
    lc.x = x;
    layernorm(x, p.ln1_w, p.ln1_b, T, D, m.eps, lc.ln1, lc.mean1, lc.rstd1);
    conv1d(lc.ln1, p.attn_w, p.attn_b, T, D, 3 * D, lc.qkv);
    lc.att.assign(static_cast<std::size_t>(H) * T * T, 0.0);
    lc.y.assign(static_cast<std::size_t>(T) * D, 0.0);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const double* q = &lc.qkv[static_cast<std::size_t>(t) * 3 * D + h * Dh];
        double* a = &lc.att[(static_cast<std::size_t>(h) * T + t) * T];
        double mx = -1e300;
        for (int s = 0; s <= t; ++s) {
          const double* k = &lc.qkv[static_cast<std::size_t>(s) * 3 * D + D + h * Dh];
          double dot = 0.0;
          for (int d = 0; d < Dh; ++d) dot += q[d] * k[d];
          a[s] = dot * scale;
          mx = std::max(mx, a[s]);
        }
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) sum += (a[s] = std::exp(a[s] - mx));
        for (int s = 0; s <= t; ++s) a[s] /= sum;
        for (int s = 0; s <= t; ++s) {
          const double* v = &lc.qkv[static_cast<std::size_t>(s) * 3 * D + 2 * D + h * Dh];
          for (int d = 0; d < Dh; ++d) lc.y[static_cast<std::size_t>(t) * D + h * Dh + d] += a[s] * v[d];
        }
      }
    vec proj;
    conv1d(lc.y, p.proj_w, p.proj_b, T, D, D, proj);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    lc.x_mid = x;
    layernorm(x, p.ln2_w, p.ln2_b, T, D, m.eps, lc.ln2, lc.mean2, lc.rstd2);
    conv1d(lc.ln2, p.fc_w, p.fc_b, T, D, F, lc.fc);
    lc.g.resize(lc.fc.size());
    for (std::size_t i = 0; i < lc.fc.size(); ++i) lc.g[i] = gelu(lc.fc[i]);
    vec out;
    conv1d(lc.g, p.fcproj_w, p.fcproj_b, T, F, D, out);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += out[i];
  }
  c.x_final = x;
  layernorm(x, m.lnf_w, m.lnf_b, T, D, m.eps, c.xf, c.meanf, c.rstdf);
  const vec& head = m.lm_head.empty() ? m.wte : m.lm_head;
  c.probs.assign(static_cast<std::size_t>(T) * V, 0.0);
  double loss = 0.0;
  for (int t = 0; t < T; ++t) {
    double* pr = &c.probs[static_cast<std::size_t>(t) * V];
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0.0;
      for (int i = 0; i < D; ++i)
        s += c.xf[static_cast<std::size_t>(t) * D + i] * head[static_cast<std::size_t>(v) * D + i];
      pr[v] = s;
      mx = std::max(mx, s);
    }
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(pr[v] - mx);
    loss += -(pr[targets[t]] - mx - std::log(sum));
    for (int v = 0; v < V; ++v) pr[v] = std::exp(pr[v] - mx) / sum;
  }
  return loss;
}

/// Adds to `g` the gradient of (loss_scale * summed loss of the sequence).
inline void backward(const gpt2_model& m, const std::int32_t* ids, const std::int32_t* targets,
                     int T, const sequence_cache& c, double loss_scale, gpt2_model& g) {
  const int D = m.D, V = m.V, H = m.H, F = m.F, Dh = D / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  const bool tied = m.lm_head.empty();
  const vec& head = tied ? m.wte : m.lm_head;
  vec& dhead = tied ? g.wte : g.lm_head;

  // LM head: dlogits = (softmax - onehot) * loss_scale.
  vec dxf(static_cast<std::size_t>(T) * D, 0.0);
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) {
      const double dl =
          (c.probs[static_cast<std::size_t>(t) * V + v] - (v == targets[t] ? 1.0 : 0.0)) * loss_scale;
      for (int i = 0; i < D; ++i) {
        dxf[static_cast<std::size_t>(t) * D + i] += dl * head[static_cast<std::size_t>(v) * D + i];
        dhead[static_cast<std::size_t>(v) * D + i] += dl * c.xf[static_cast<std::size_t>(t) * D + i];
      }
    }
  vec dx(static_cast<std::size_t>(T) * D, 0.0);
  layernorm_backward(c.x_final, m.lnf_w, c.meanf, c.rstdf, dxf, T, D, dx, g.lnf_w, g.lnf_b);

  for (int l = static_cast<int>(m.layers.size()) - 1; l >= 0; --l) {
    const gpt2_layer& p = m.layers[l];
    gpt2_layer& gp = g.layers[l];
    const layer_cache& lc = c.layers[l];
    // MLP branch: x_out = x_mid + fcproj(gelu(fc(ln2(x_mid)))).
    vec dg, dfc, dln2;
    conv1d_backward(lc.g, p.fcproj_w, dx, T, F, D, dg, gp.fcproj_w, gp.fcproj_b);
    dfc.resize(dg.size());
    for (std::size_t i = 0; i < dg.size(); ++i) dfc[i] = dg[i] * gelu_grad(lc.fc[i]);
    conv1d_backward(lc.ln2, p.fc_w, dfc, T, D, F, dln2, gp.fc_w, gp.fc_b);
    layernorm_backward(lc.x_mid, p.ln2_w, lc.mean2, lc.rstd2, dln2, T, D, dx, gp.ln2_w, gp.ln2_b);
    // Attention branch: x_mid = x + proj(attn(qkv(ln1(x)))).
    vec dy, dqkv(static_cast<std::size_t>(T) * 3 * D, 0.0), dln1;
    conv1d_backward(lc.y, p.proj_w, dx, T, D, D, dy, gp.proj_w, gp.proj_b);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const double* a = &lc.att[(static_cast<std::size_t>(h) * T + t) * T];
        const double* dyt = &dy[static_cast<std::size_t>(t) * D + h * Dh];
        vec da(t + 1);
        double dot_ada = 0.0;
        for (int s = 0; s <= t; ++s) {
          const double* v = &lc.qkv[static_cast<std::size_t>(s) * 3 * D + 2 * D + h * Dh];
          double* dv = &dqkv[static_cast<std::size_t>(s) * 3 * D + 2 * D + h * Dh];
          double d = 0.0;
          for (int k = 0; k < Dh; ++k) {
            d += dyt[k] * v[k];
            dv[k] += a[s] * dyt[k];
          }
          da[s] = d;
          dot_ada += a[s] * d;
        }
        const double* q = &lc.qkv[static_cast<std::size_t>(t) * 3 * D + h * Dh];
        double* dq = &dqkv[static_cast<std::size_t>(t) * 3 * D + h * Dh];
        for (int s = 0; s <= t; ++s) {
          const double ds = a[s] * (da[s] - dot_ada) * scale;  // softmax backward
          const double* k = &lc.qkv[static_cast<std::size_t>(s) * 3 * D + D + h * Dh];
          double* dk = &dqkv[static_cast<std::size_t>(s) * 3 * D + D + h * Dh];
          for (int e = 0; e < Dh; ++e) {
            dq[e] += ds * k[e];
            dk[e] += ds * q[e];
          }
        }
      }
    conv1d_backward(lc.ln1, p.attn_w, dqkv, T, D, 3 * D, dln1, gp.attn_w, gp.attn_b);
    layernorm_backward(lc.x, p.ln1_w, lc.mean1, lc.rstd1, dln1, T, D, dx, gp.ln1_w, gp.ln1_b);
  }
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D; ++i) {
      g.wte[static_cast<std::size_t>(ids[t]) * D + i] += dx[static_cast<std::size_t>(t) * D + i];
      g.wpe[static_cast<std::size_t>(t) * D + i] += dx[static_cast<std::size_t>(t) * D + i];
    }
}

/// Mean loss over a batch of B sequences (row b = ids[b*T .. b*T+T)); adds
/// the gradient of that mean to `g`.
inline double forward_backward(const gpt2_model& m, const std::vector<std::int32_t>& ids,
                               const std::vector<std::int32_t>& targets, int B, int T,
                               gpt2_model& g) {
  double loss = 0.0;
  sequence_cache c;
  const double n = static_cast<double>(B) * T;
  for (int b = 0; b < B; ++b) {
    const std::int32_t* row_ids = ids.data() + static_cast<std::size_t>(b) * T;
    const std::int32_t* row_targets = targets.data() + static_cast<std::size_t>(b) * T;
    loss += forward(m, row_ids, row_targets, T, c);
    backward(m, row_ids, row_targets, T, c, 1.0 / n, g);
  }
  return loss / n;
}

/// torch.optim.AdamW, in double, over every tensor of the model.
struct adamw {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  std::int64_t t = 0;
  gpt2_model m, v;

  void step(gpt2_model& params, gpt2_model& grads) {
    if (t == 0) {
      m = params.zeros_like();
      v = params.zeros_like();
    }
    ++t;
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
    auto ps = params.tensors();
    auto gs = grads.tensors();
    auto ms = m.tensors();
    auto vs = v.tensors();
    for (std::size_t k = 0; k < ps.size(); ++k)
      for (std::size_t i = 0; i < ps[k]->size(); ++i) {
        double& p = (*ps[k])[i];
        const double gr = (*gs[k])[i];
        double& mm = (*ms[k])[i];
        double& vv = (*vs[k])[i];
        p *= 1.0 - lr * weight_decay;
        mm = beta1 * mm + (1.0 - beta1) * gr;
        vv = beta2 * vv + (1.0 - beta2) * gr * gr;
        p -= lr / bc1 * mm / (std::sqrt(vv) / std::sqrt(bc2) + eps);
      }
  }
};

/// Batch `index` of the sequential scheme in the issue: row j of batch i is
/// tokens[p + j*T, p + j*T + T) with p the batch's start, targets shifted by
/// one; a batch starts over at 0 when fewer than B*T+1 tokens remain.
struct batcher {
  const std::vector<std::int32_t>* tokens = nullptr;
  std::size_t pos = 0;
  void next(int B, int T, std::vector<std::int32_t>& ids, std::vector<std::int32_t>& targets) {
    const std::size_t n = static_cast<std::size_t>(B) * T;
    if (tokens->size() - pos < n + 1) pos = 0;
    ids.assign(tokens->begin() + pos, tokens->begin() + pos + n);
    targets.assign(tokens->begin() + pos + 1, tokens->begin() + pos + n + 1);
    pos += n;
  }
};

}  // namespace corolla::testing::ref
