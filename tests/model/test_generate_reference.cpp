// fp32 greedy generation equals an independent float64 reference, token for
// token. The reference below is written from the HuggingFace model
// definitions (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, GPT2LMHeadModel, and
// modeling_rope_utils.py's rope_scaling types) as plain loops over the
// checkpoint's own tensors and config text: it shares no kernel, no name
// mapping, no layout conversion and no config parsing with corolla, only the
// file reader of the test fixture. (The mixtures of experts read their
// config.json fields themselves.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/generator.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

namespace {

using vec = std::vector<double>;

/// A sparse mixture-of-experts MLP as config.json describes it (HF's
/// MixtralConfig / Qwen3MoeConfig fields); experts == 0 for a dense MLP.
struct ref_moe {
  int experts = 0;      ///< num_local_experts (Mixtral) / num_experts (Qwen3-MoE)
  int top_k = 0;        ///< num_experts_per_tok
  int width = 0;        ///< each expert's: intermediate_size (Mixtral) / moe_intermediate_size (Qwen3-MoE)
  bool renormalise = false;  ///< Mixtral always; Qwen3-MoE's norm_topk_prob (default false)
  bool mixtral = false;      ///< names: block_sparse_moe.{gate, experts.E.w1/w2/w3} vs mlp.{gate, experts.E.*_proj}
  int shared_width = 0;      ///< Qwen2-MoE: shared_expert_intermediate_size (mlp.shared_expert.*, mlp.shared_expert_gate)
};

/// The checkpoint's tensors in double, by HF name (GPT-2's optional
/// "transformer." prefix removed), and the mixture of experts of its
/// config.json.
struct ref_weights {
  std::map<std::string, vec> t;
  ref_moe moe;
  /// The smallest gap between the k-th and (k+1)-th router logit of any
  /// token routed so far (a tie there would make f32 and f64 route apart).
  mutable double min_router_margin = 1e300;
  const vec& at(const std::string& name) const {
    auto it = t.find(name);
    if (it == t.end()) FAIL("reference: tensor " << name << " missing");
    return it->second;
  }
};

ref_moe read_moe(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  if (!in) FAIL("reference: no config.json in " << dir);
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string type = j.value("model_type", std::string());
  ref_moe m;
  if (type == "mixtral") {
    m.mixtral = true;
    m.experts = j.at("num_local_experts").get<int>();
    m.width = j.at("intermediate_size").get<int>();
    m.renormalise = true;  // MixtralSparseMoeBlock: routing_weights /= routing_weights.sum(...), always
  } else if (type == "qwen3_moe" || type == "qwen2_moe") {
    m.experts = j.at("num_experts").get<int>();
    if (type == "qwen2_moe") m.shared_width = j.value("shared_expert_intermediate_size", 5632);
    m.width = j.at("moe_intermediate_size").get<int>();
    m.renormalise = j.value("norm_topk_prob", false);
    if (j.value("decoder_sparse_step", 1) != 1 || !j.value("mlp_only_layers", nlohmann::json::array()).empty())
      FAIL("reference: only all-sparse Qwen-MoE layers");
  } else {
    return m;
  }
  m.top_k = j.at("num_experts_per_tok").get<int>();
  return m;
}

ref_weights read_weights(const std::filesystem::path& dir) {
  ref_weights w;
  for (auto& [name, values] : testing::read_all_f32(dir)) {
    std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    w.t[n] = vec(values.begin(), values.end());
  }
  w.moe = read_moe(dir);
  return w;
}

/// y[o] = sum_i W[o, i] x[i] for an nn.Linear weight [out, in].
vec linear(const vec& W, const vec& x, std::size_t out) {
  const std::size_t in = x.size();
  vec y(out, 0.0);
  for (std::size_t o = 0; o < out; ++o)
    for (std::size_t i = 0; i < in; ++i) y[o] += W[o * in + i] * x[i];
  return y;
}

/// y[o] = sum_i x[i] W[i, o] + b[o] for a GPT-2 Conv1D weight [in, out].
vec conv1d(const vec& W, const vec& b, const vec& x) {
  const std::size_t in = x.size(), out = b.size();
  vec y(b);
  for (std::size_t i = 0; i < in; ++i)
    for (std::size_t o = 0; o < out; ++o) y[o] += x[i] * W[i * out + o];
  return y;
}

vec rmsnorm(const vec& x, const vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

vec layernorm(const vec& x, const vec& w, const vec& b, double eps) {
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(x.size());
  const double r = 1.0 / std::sqrt(var + eps);
  vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) * r * w[i] + b[i];
  return y;
}

/// Causal attention of every position of one sequence. q: [T][Hq*Dh],
/// k, v: [T][Hkv*Dh]; query head h reads key/value head h / (Hq / Hkv).
std::vector<vec> attention(const std::vector<vec>& q, const std::vector<vec>& k,
                           const std::vector<vec>& v, int Hq, int Hkv, int Dh) {
  const std::size_t T = q.size();
  std::vector<vec> out(T, vec(static_cast<std::size_t>(Hq * Dh), 0.0));
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  for (std::size_t t = 0; t < T; ++t)
    for (int h = 0; h < Hq; ++h) {
      const int kvh = h / (Hq / Hkv);
      vec s(t + 1);
      double mx = -1e300;
      for (std::size_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int i = 0; i < Dh; ++i) d += q[t][h * Dh + i] * k[j][kvh * Dh + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (auto& x : s) z += (x = std::exp(x - mx));
      for (std::size_t j = 0; j <= t; ++j)
        for (int i = 0; i < Dh; ++i) out[t][h * Dh + i] += s[j] / z * v[j][kvh * Dh + i];
    }
  return out;
}

/// The inverse frequencies and the cos/sin scale HF's rotary embedding uses
/// for `o`'s config (modeling_rope_utils.py: default, linear, llama3, yarn).
struct ref_rope {
  vec inv_freq;
  double scale = 1.0;
};

ref_rope reference_rope(const testing::tiny_model_options& o, int Dh) {
  ref_rope r;
  const double base = o.rope_theta;
  for (int i = 0; i < Dh / 2; ++i) r.inv_freq.push_back(1.0 / std::pow(base, 2.0 * i / Dh));
  if (o.rope_scaling.empty()) return r;
  const nlohmann::json s = nlohmann::json::parse(o.rope_scaling);
  const std::string type = s.value("rope_type", s.value("type", std::string("default")));
  const double factor = s.value("factor", 1.0);
  if (type == "linear") {
    for (double& f : r.inv_freq) f /= factor;
  } else if (type == "llama3") {
    const double low = s.at("low_freq_factor"), high = s.at("high_freq_factor");
    const double old_len = s.at("original_max_position_embeddings");
    for (double& f : r.inv_freq) {
      const double wavelen = 2 * std::numbers::pi / f;
      const double scaled = wavelen > old_len / low ? f / factor : f;
      const double smooth = (old_len / wavelen - low) / (high - low);
      const bool medium = !(wavelen < old_len / high) && !(wavelen > old_len / low);
      f = medium ? (1 - smooth) * scaled / factor + smooth * scaled : scaled;
    }
  } else if (type == "yarn") {
    const double original = s.value("original_max_position_embeddings", static_cast<double>(o.max_positions));
    r.scale = s.contains("attention_factor") ? s.at("attention_factor").get<double>()
                                             : (factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0);
    auto correction_dim = [&](double rotations) {
      return Dh * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    const double lo = std::max(std::floor(correction_dim(s.value("beta_fast", 32.0))), 0.0);
    double hi = std::min(std::ceil(correction_dim(s.value("beta_slow", 1.0))), Dh - 1.0);
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < Dh / 2; ++i) {
      const double extrapolation = 1.0 - std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
      const double f = r.inv_freq[static_cast<std::size_t>(i)];
      r.inv_freq[static_cast<std::size_t>(i)] = f / factor * (1 - extrapolation) + f * extrapolation;
    }
  } else if (type != "default") {
    FAIL("reference: rope type " << type);
  }
  return r;
}

/// HF rotate-half RoPE on each head of x at position `pos`.
void rope(vec& x, int heads, int Dh, std::size_t pos, const ref_rope& r) {
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < Dh / 2; ++i) {
      const double a = static_cast<double>(pos) * r.inv_freq[static_cast<std::size_t>(i)];
      const double c = std::cos(a) * r.scale, s = std::sin(a) * r.scale;
      double& x1 = x[h * Dh + i];
      double& x2 = x[h * Dh + i + Dh / 2];
      const double r1 = x1 * c - x2 * s;
      const double r2 = x2 * c + x1 * s;
      x1 = r1;
      x2 = r2;
    }
}

/// x + b when the checkpoint holds bias `name`, else x.
vec plus_bias(const ref_weights& w, const std::string& name, vec x) {
  if (!w.t.count(name)) return x;
  const vec& b = w.at(name);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += b[i];
  return x;
}

/// Qwen3's q_norm / k_norm: RMSNorm of each head's Dh values, when the
/// checkpoint has the weight.
void head_norm(const ref_weights& w, const std::string& name, vec& x, int heads, int Dh, double eps) {
  if (!w.t.count(name)) return;
  for (int h = 0; h < heads; ++h) {
    vec part(x.begin() + h * Dh, x.begin() + (h + 1) * Dh);
    part = rmsnorm(part, w.at(name), eps);
    std::copy(part.begin(), part.end(), x.begin() + h * Dh);
  }
}

/// y += scale * the SwiGLU MLP of width F under prefix x (Qwen's
/// gate_proj / up_proj / down_proj, or Mixtral's w1 / w3 / w2) of row h.
void add_swiglu(const ref_weights& w, const std::string& x, bool mixtral, std::size_t F, const vec& h, double scale,
                vec& y) {
  const std::size_t D = h.size();
  vec g = linear(w.at(x + (mixtral ? "w1.weight" : "gate_proj.weight")), h, F);
  const vec u = linear(w.at(x + (mixtral ? "w3.weight" : "up_proj.weight")), h, F);
  for (std::size_t i = 0; i < F; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  const vec down = linear(w.at(x + (mixtral ? "w2.weight" : "down_proj.weight")), g, D);
  for (std::size_t i = 0; i < D; ++i) y[i] += scale * down[i];
}

/// The sparse MoE MLP of layer prefix `p` on one normed row h, as
/// MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock
/// compute it: router logits, softmax over the experts (f32 in HF, double
/// here), torch.topk (largest first; ties to the lower index), the top-k
/// probabilities renormalised when configured, the weighted sum of the
/// chosen SwiGLU experts, and Qwen2-MoE's shared expert times
/// sigmoid(shared_expert_gate(h)).
vec sparse_moe(const ref_weights& w, const std::string& p, const vec& h) {
  const ref_moe& m = w.moe;
  const std::size_t D = h.size(), E = static_cast<std::size_t>(m.experts), k = static_cast<std::size_t>(m.top_k);
  const std::string block = p + (m.mixtral ? "block_sparse_moe." : "mlp.");
  const vec logits = linear(w.at(block + "gate.weight"), h, E);
  const double top = *std::max_element(logits.begin(), logits.end());
  vec probs(E);
  double z = 0;
  for (std::size_t e = 0; e < E; ++e) z += (probs[e] = std::exp(logits[e] - top));
  for (double& x : probs) x /= z;
  std::vector<std::size_t> order(E);
  for (std::size_t e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return probs[a] > probs[b]; });
  if (k < E) w.min_router_margin = std::min(w.min_router_margin, logits[order[k - 1]] - logits[order[k]]);
  double chosen = 0;
  for (std::size_t j = 0; j < k; ++j) chosen += probs[order[j]];
  vec y(D, 0.0);
  for (std::size_t j = 0; j < k; ++j) {
    const double weight = m.renormalise ? probs[order[j]] / chosen : probs[order[j]];
    add_swiglu(w, block + "experts." + std::to_string(order[j]) + ".", m.mixtral, static_cast<std::size_t>(m.width), h,
               weight, y);
  }
  if (m.shared_width > 0) {
    const double z = linear(w.at(block + "shared_expert_gate.weight"), h, 1)[0];
    add_swiglu(w, block + "shared_expert.", false, static_cast<std::size_t>(m.shared_width), h, 1.0 / (1.0 + std::exp(-z)),
               y);
  }
  return y;
}

/// Logits of the last position of `ids` (a full forward, no cache).
vec llama_logits(const ref_weights& w, const testing::tiny_model_options& o,
                 const std::vector<std::int32_t>& ids) {
  const int D = o.hidden, Hq = o.heads, Hkv = o.kv_heads, F = o.intermediate;
  const int Dh = o.head_dim > 0 ? o.head_dim : D / Hq;
  const double eps = o.norm_eps;
  const ref_rope rot = reference_rope(o, Dh);
  std::vector<vec> x;
  const vec& emb = w.at("model.embed_tokens.weight");
  for (auto id : ids) x.emplace_back(emb.begin() + id * D, emb.begin() + (id + 1) * D);
  for (int l = 0; l < o.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<vec> q, k, v;
    for (std::size_t t = 0; t < x.size(); ++t) {
      vec h = rmsnorm(x[t], w.at(p + "input_layernorm.weight"), eps);
      q.push_back(plus_bias(w, p + "self_attn.q_proj.bias", linear(w.at(p + "self_attn.q_proj.weight"), h, Hq * Dh)));
      k.push_back(plus_bias(w, p + "self_attn.k_proj.bias", linear(w.at(p + "self_attn.k_proj.weight"), h, Hkv * Dh)));
      v.push_back(plus_bias(w, p + "self_attn.v_proj.bias", linear(w.at(p + "self_attn.v_proj.weight"), h, Hkv * Dh)));
      head_norm(w, p + "self_attn.q_norm.weight", q.back(), Hq, Dh, eps);
      head_norm(w, p + "self_attn.k_norm.weight", k.back(), Hkv, Dh, eps);
      rope(q.back(), Hq, Dh, t, rot);
      rope(k.back(), Hkv, Dh, t, rot);
    }
    auto a = attention(q, k, v, Hq, Hkv, Dh);
    for (std::size_t t = 0; t < x.size(); ++t) {
      vec proj = plus_bias(w, p + "self_attn.o_proj.bias", linear(w.at(p + "self_attn.o_proj.weight"), a[t], D));
      for (int i = 0; i < D; ++i) x[t][i] += proj[i];
      vec h = rmsnorm(x[t], w.at(p + "post_attention_layernorm.weight"), eps);
      if (w.moe.experts > 0) {
        const vec y = sparse_moe(w, p, h);
        for (int i = 0; i < D; ++i) x[t][i] += y[i];
        continue;
      }
      vec g = linear(w.at(p + "mlp.gate_proj.weight"), h, F);
      vec u = linear(w.at(p + "mlp.up_proj.weight"), h, F);
      for (int i = 0; i < F; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      vec down = linear(w.at(p + "mlp.down_proj.weight"), g, D);
      for (int i = 0; i < D; ++i) x[t][i] += down[i];
    }
  }
  vec h = rmsnorm(x.back(), w.at("model.norm.weight"), eps);
  return linear(o.tied ? emb : w.at("lm_head.weight"), h, o.vocab);
}

vec gpt2_logits(const ref_weights& w, const testing::tiny_model_options& o,
                const std::vector<std::int32_t>& ids) {
  const int D = o.hidden, H = o.heads, Dh = D / H;
  const double eps = o.norm_eps;
  const vec& wte = w.at("wte.weight");
  const vec& wpe = w.at("wpe.weight");
  std::vector<vec> x;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    vec e(D);
    for (int i = 0; i < D; ++i) e[i] = wte[ids[t] * D + i] + wpe[t * D + i];
    x.push_back(e);
  }
  for (int l = 0; l < o.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    std::vector<vec> q, k, v;
    for (auto& xt : x) {
      vec h = layernorm(xt, w.at(p + "ln_1.weight"), w.at(p + "ln_1.bias"), eps);
      vec qkv = conv1d(w.at(p + "attn.c_attn.weight"), w.at(p + "attn.c_attn.bias"), h);
      q.emplace_back(qkv.begin(), qkv.begin() + D);
      k.emplace_back(qkv.begin() + D, qkv.begin() + 2 * D);
      v.emplace_back(qkv.begin() + 2 * D, qkv.end());
    }
    auto a = attention(q, k, v, H, H, Dh);
    for (std::size_t t = 0; t < x.size(); ++t) {
      vec proj = conv1d(w.at(p + "attn.c_proj.weight"), w.at(p + "attn.c_proj.bias"), a[t]);
      for (int i = 0; i < D; ++i) x[t][i] += proj[i];
      vec h = layernorm(x[t], w.at(p + "ln_2.weight"), w.at(p + "ln_2.bias"), eps);
      vec f = conv1d(w.at(p + "mlp.c_fc.weight"), w.at(p + "mlp.c_fc.bias"), h);
      for (auto& z : f)  // gelu_new
        z = 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (z + 0.044715 * z * z * z)));
      vec down = conv1d(w.at(p + "mlp.c_proj.weight"), w.at(p + "mlp.c_proj.bias"), f);
      for (int i = 0; i < D; ++i) x[t][i] += down[i];
    }
  }
  vec h = layernorm(x.back(), w.at("ln_f.weight"), w.at("ln_f.bias"), eps);
  return linear(wte, h, o.vocab);
}

struct reference_run {
  std::vector<std::int32_t> tokens;
  double min_margin = 1e300;  ///< smallest gap between the best and second logit
  double min_router_margin = 1e300;  ///< mixtures of experts: smallest top-k router logit gap
};

reference_run reference_greedy(const std::filesystem::path& dir,
                               const testing::tiny_model_options& o,
                               std::vector<std::int32_t> ids, int new_tokens) {
  const ref_weights w = read_weights(dir);
  reference_run r;
  for (int n = 0; n < new_tokens; ++n) {
    vec logits = o.arch == architecture::gpt2 ? gpt2_logits(w, o, ids) : llama_logits(w, o, ids);
    auto best = std::max_element(logits.begin(), logits.end());
    double second = -1e300;
    for (auto it = logits.begin(); it != logits.end(); ++it)
      if (it != best) second = std::max(second, *it);
    r.min_margin = std::min(r.min_margin, *best - second);
    const auto id = static_cast<std::int32_t>(best - logits.begin());
    r.tokens.push_back(id);
    ids.push_back(id);
  }
  r.min_router_margin = w.min_router_margin;
  return r;
}

void check_against_reference(const testing::tiny_model_options& o) {
  testing::temp_dir_guard dir("reference");
  testing::write_tiny_model(dir.path(), o);
  const std::vector<std::int32_t> prompt{3, 17, 42, 8, 29};
  const int new_tokens = 12;
  const reference_run ref = reference_greedy(dir.path(), o, prompt, new_tokens);

  transformer model = transformer::load(dir.path(), cpu_backend());
  generator gen(model);
  generation_params p;
  p.max_new_tokens = new_tokens;
  p.ignore_eos = true;
  generation_result r = gen.generate(prompt, p);
  INFO("smallest top-1/top-2 logit gap in the reference: " << ref.min_margin);
  INFO("smallest top-k router logit gap in the reference (mixtures of experts): " << ref.min_router_margin);
  CHECK(r.tokens == ref.tokens);
  CHECK(r.reason == stop_reason::max_tokens);
  // The generated sequence is not trivially constant (the check has teeth).
  CHECK(std::set<std::int32_t>(ref.tokens.begin(), ref.tokens.end()).size() > 2);

  // Values too, not only the argmax: the last step's logits of every position.
  std::vector<std::int32_t> all = prompt;
  all.insert(all.end(), ref.tokens.begin(), ref.tokens.end() - 1);
  const ref_weights w = read_weights(dir.path());
  const std::vector<float> got = model.forward_logits(all).to_vector();
  double worst = 0;
  for (std::size_t t = 1; t <= all.size(); t += 5) {
    std::vector<std::int32_t> head(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(t));
    vec want = o.arch == architecture::gpt2 ? gpt2_logits(w, o, head) : llama_logits(w, o, head);
    for (int v = 0; v < o.vocab; ++v)
      worst = std::max(worst, std::abs(want[static_cast<std::size_t>(v)] -
                                       got[(t - 1) * static_cast<std::size_t>(o.vocab) +
                                           static_cast<std::size_t>(v)]));
  }
  INFO("largest logit difference to the float64 reference: " << worst);
  CHECK(worst < 1e-4);
}

testing::tiny_model_options options(architecture arch, int kv_heads, bool tied, dtype storage,
                                    int shards, std::uint64_t seed) {
  testing::tiny_model_options o;
  o.arch = arch;
  o.kv_heads = arch == architecture::gpt2 ? o.heads : kv_heads;
  o.tied = arch == architecture::gpt2 ? true : tied;
  o.storage = storage;
  o.shards = shards;
  o.seed = seed;
  if (arch == architecture::gpt2) o.intermediate = 4 * o.hidden;
  return o;
}

}  // namespace

TEST_CASE("greedy generation equals the float64 reference: llama GQA untied") {
  check_against_reference(options(architecture::llama, 2, false, dtype::f32, 1, 11));
}

TEST_CASE("greedy generation equals the float64 reference: llama MHA tied") {
  check_against_reference(options(architecture::llama, 4, true, dtype::f32, 1, 12));
}

TEST_CASE("greedy generation equals the float64 reference: llama MHA untied, GQA tied") {
  check_against_reference(options(architecture::llama, 4, false, dtype::f32, 1, 13));
  check_against_reference(options(architecture::llama, 2, true, dtype::f32, 1, 14));
}

TEST_CASE("greedy generation equals the float64 reference: qwen2 (q/k/v biases), tied and untied") {
  auto o = options(architecture::llama, 2, true, dtype::f32, 1, 21);
  o.family = "Qwen2ForCausalLM";
  check_against_reference(o);
  o.tied = false;
  o.seed = 22;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: qwen3 (q/k norms, head_dim 16 for hidden 32 / 4 heads)") {
  auto o = options(architecture::llama, 2, false, dtype::f32, 1, 41);
  o.family = "Qwen3ForCausalLM";
  // The per-head norms bound the attention logits: with the default weights
  // greedy decoding settles into a two-token loop at once.
  o.init_std = 0.6f;
  o.head_dim = 16;
  check_against_reference(o);
  o.attention_bias = true;  // Qwen3's attention_bias: q, k, v and o
  o.kv_heads = 4;
  o.seed = 24;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: llama with attention_bias") {
  auto o = options(architecture::llama, 2, false, dtype::f32, 1, 25);
  o.attention_bias = true;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: scaled RoPE (llama3, linear, yarn), rope_theta 500000") {
  // Original contexts of a few positions, so that the scaling changes the
  // angles of the 17 positions generated.
  for (const char* scaling : {
           R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})",
           R"({"type": "linear", "factor": 2.5})",
           R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})",
           R"({"rope_type": "yarn", "factor": 2.0, "beta_fast": 8, "beta_slow": 2, "attention_factor": 1.3})"}) {
    CAPTURE(scaling);
    auto o = options(architecture::llama, 2, false, dtype::f32, 1, 26);
    o.rope_theta = 500000.0f;
    o.rope_scaling = scaling;
    check_against_reference(o);
  }
}

TEST_CASE("greedy generation equals the float64 reference: gpt2") {
  check_against_reference(options(architecture::gpt2, 4, true, dtype::f32, 1, 15));
}

TEST_CASE("bf16 and f16 checkpoints generate as the reference of their rounded weights") {
  check_against_reference(options(architecture::llama, 2, false, dtype::bf16, 1, 16));
  check_against_reference(options(architecture::gpt2, 4, true, dtype::bf16, 1, 17));
  check_against_reference(options(architecture::llama, 2, true, dtype::f16, 1, 18));
}

TEST_CASE("sharded checkpoints generate as the reference") {
  check_against_reference(options(architecture::llama, 2, false, dtype::f32, 2, 19));
  check_against_reference(options(architecture::gpt2, 4, true, dtype::bf16, 2, 20));
}

TEST_CASE("greedy generation equals the float64 reference: mixtral (top-2 of 4 experts, GQA, untied)") {
  auto o = options(architecture::llama, 2, false, dtype::f32, 1, 51);
  o.family = "MixtralForCausalLM";
  o.experts = 4;
  o.experts_per_token = 2;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: qwen3-moe (tied, norm_topk_prob, q/k norms)") {
  auto o = options(architecture::llama, 2, true, dtype::f32, 1, 52);
  o.family = "Qwen3MoeForCausalLM";
  o.init_std = 0.6f;  // as for Qwen3: the per-head norms bound the attention logits
  o.head_dim = 16;
  o.experts = 4;
  o.experts_per_token = 2;
  o.norm_topk_prob = true;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: qwen3-moe with top-1 routing and norm_topk_prob false") {
  auto o = options(architecture::llama, 2, false, dtype::f32, 1, 53);
  o.family = "Qwen3MoeForCausalLM";
  o.init_std = 0.6f;
  o.experts = 5;
  o.experts_per_token = 1;
  o.norm_topk_prob = false;  // the one weight is the expert's probability, not 1
  check_against_reference(o);
  o.experts_per_token = 3;  // and top-3 of 5, not renormalised
  o.seed = 54;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: qwen2-moe (a gated shared expert, q/k/v biases, tied)") {
  auto o = options(architecture::llama, 2, true, dtype::f32, 1, 56);
  o.family = "Qwen2MoeForCausalLM";
  o.experts = 4;
  o.experts_per_token = 2;
  o.norm_topk_prob = false;  // Qwen1.5-MoE's and Qwen2-57B-A14B's choice
  o.shared_expert = 64;      // wider than an expert (48), as in the real models
  check_against_reference(o);
  o.tied = false;
  o.norm_topk_prob = true;
  o.seed = 57;
  check_against_reference(o);
}

TEST_CASE("greedy generation equals the float64 reference: mixtral from a sharded bf16 checkpoint") {
  auto o = options(architecture::llama, 4, false, dtype::bf16, 2, 55);
  o.family = "MixtralForCausalLM";
  check_against_reference(o);
}
