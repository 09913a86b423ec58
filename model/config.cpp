// model/config.cpp — HuggingFace config.json <-> model_config.
//
// We accept only what the kernels implement exactly: a config that asks for
// something else (dynamic or LongRoPE scaling, MLP biases, another GELU)
// is rejected with a message naming the field, rather than run subtly wrong.
#include "model/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/json_file.hpp"

namespace corolla {
namespace {

using json = nlohmann::json;

const char* kSupported =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
    "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, GPT2LMHeadModel";

/// Reads config fields and names the field and file in every error.
class field_reader {
 public:
  field_reader(const json& j, const std::string& origin) : j_(j), origin_(origin) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw model_error("field '" + std::string(key) + "' in " + origin_ + " " + what);
  }

  const json& required(const char* key) const {
    if (!j_.contains(key)) throw model_error("missing field '" + std::string(key) + "' in " + origin_);
    if (j_.at(key).is_null()) fail(key, "is null");
    return j_.at(key);
  }

  /// A positive integer that fits an int.
  int positive_int(const char* key) const { return check_positive(key, required(key)); }
  int positive_int_or(const char* key, int fallback) const {
    return has(key) ? check_positive(key, j_.at(key)) : fallback;
  }

  float positive_float(const char* key) const { return check_positive_float(key, required(key)); }
  float positive_float_or(const char* key, float fallback) const {
    return has(key) ? check_positive_float(key, j_.at(key)) : fallback;
  }

  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "must be true or false, got " + v.dump());
    return v.get<bool>();
  }

  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }

  /// bos/eos ids: an int, a list of ints (the first is used) or null (-1).
  int token_id(const char* key) const {
    const std::vector<int> ids = token_ids(key);
    return ids.empty() ? -1 : ids.front();
  }

  /// Every id of an int or a list of ints (none for null).
  std::vector<int> token_ids(const char* key) const {
    std::vector<int> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    for (const json& e : v.is_array() ? v : json::array({v})) {
      if (!e.is_number_integer() || e.get<long long>() < 0 || e.get<long long>() > 0x7fffffff)
        fail(key, "must be a non-negative token id (or a list of them), got " + v.dump());
      out.push_back(e.get<int>());
    }
    return out;
  }

 private:
  int check_positive(const char* key, const json& v) const {
    if (!v.is_number_integer() || v.get<long long>() <= 0 || v.get<long long>() > 0x7fffffff)
      fail(key, "must be a positive integer, got " + v.dump());
    return v.get<int>();
  }
  float check_positive_float(const char* key, const json& v) const {
    if (!v.is_number() || !(v.get<double>() > 0.0) || !std::isfinite(v.get<double>()))
      fail(key, "must be a positive number, got " + v.dump());
    return static_cast<float>(v.get<double>());
  }

  const json& j_;
  const std::string& origin_;
};

/// A number under `key` of `o`, 0 when absent, null or not a number (HF
/// treats those, and 0, as unset).
double number_or_zero(const json& o, const char* key) {
  return o.contains(key) && o.at(key).is_number() ? o.at(key).get<double>() : 0.0;
}

/// config.json's rope_scaling (null: plain RoPE), as
/// transformers/modeling_rope_utils.py reads it: "rope_type" (or the older
/// "type") default, linear, llama3 or yarn. yarn's ramp is found from
/// beta_fast/beta_slow over original_max_position_embeddings (default: the
/// model's max_position_embeddings), floored/ceiled unless truncate is
/// false; its attention factor is given, or from mscale/mscale_all_dim, or
/// 0.1 ln(factor) + 1. yarn's `factor` is taken as written, as vLLM, TGI
/// and transformers do outside 4.50-4.55 (which replaced it with
/// max_position_embeddings / original_max_position_embeddings whenever the
/// latter was given; transformers PR #40320 went back).
rope_spec parse_rope_scaling(const field_reader& f, const json& j, const std::string& origin, double theta,
                             int head_dim, int max_positions) {
  rope_spec r(theta);
  if (!f.has("rope_scaling")) return r;
  const json& s = j.at("rope_scaling");
  if (!s.is_object()) f.fail("rope_scaling", "must be an object or null, got " + s.dump());
  const std::string where = "rope_scaling in " + origin;
  field_reader g(s, where);
  const std::string type = g.has("rope_type") ? g.string_or("rope_type", "") : g.string_or("type", "default");
  if (type == "default") return r;
  if (type == "dynamic")
    throw model_error("rope_scaling type 'dynamic' in " + origin +
                      " is not supported: its frequencies change with the sequence length, so keys cached at one "
                      "length would be rotated for another (supported: default, linear, llama3, yarn)");
  if (type != "linear" && type != "llama3" && type != "yarn")
    throw model_error("rope_scaling type '" + type + "' in " + origin +
                      " is not supported (supported: default, linear, llama3, yarn)");
  r.factor = g.positive_float("factor");
  if (type == "linear") {
    r.kind = rope_kind::linear;
    return r;
  }
  if (type == "llama3") {
    r.kind = rope_kind::llama3;
    r.low_freq_factor = g.positive_float("low_freq_factor");
    r.high_freq_factor = g.positive_float("high_freq_factor");
    r.original_max_positions = g.positive_int("original_max_position_embeddings");
    if (!(r.high_freq_factor > r.low_freq_factor))
      g.fail("high_freq_factor", "must be greater than low_freq_factor");
    return r;
  }
  r.kind = rope_kind::yarn;
  const double original = g.positive_int_or("original_max_position_embeddings", max_positions);
  auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (g.has("attention_factor")) {
    r.attention_factor = g.positive_float("attention_factor");
  } else if (const double m = number_or_zero(s, "mscale"), all = number_or_zero(s, "mscale_all_dim"); m != 0 && all != 0) {
    r.attention_factor = mscale(r.factor, m) / mscale(r.factor, all);  // DeepSeek's pair (HF: both truthy)
  } else {
    r.attention_factor = mscale(r.factor, 1.0);
  }
  const double beta_fast = g.positive_float_or("beta_fast", 32.0f), beta_slow = g.positive_float_or("beta_slow", 1.0f);
  const double dim = head_dim;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * 3.14159265358979323846)) / (2 * std::log(theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (g.boolean_or("truncate", true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  r.ramp_low = std::max(low, 0.0);
  r.ramp_high = std::min(high, dim - 1);
  return r;
}

model_config parse_llama(const field_reader& f, const json& j, const std::string& origin, const std::string& hf_arch) {
  model_config c;
  c.arch = architecture::llama;
  c.hf_architecture = hf_arch;
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  c.n_layers = f.positive_int("num_hidden_layers");
  c.n_heads = f.positive_int("num_attention_heads");
  c.n_kv_heads = f.positive_int_or("num_key_value_heads", c.n_heads);
  if (f.has("head_dim")) {
    c.head_dim = f.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.n_heads != 0)
      f.fail("hidden_size", "(" + std::to_string(c.hidden_size) +
                                ") is not divisible by num_attention_heads (" +
                                std::to_string(c.n_heads) + ") and no head_dim is given");
    c.head_dim = c.hidden_size / c.n_heads;
  }
  const bool qwen2_moe = hf_arch == "Qwen2MoeForCausalLM", qwen2 = hf_arch == "Qwen2ForCausalLM" || qwen2_moe;
  const bool qwen3_moe = hf_arch == "Qwen3MoeForCausalLM", mixtral = hf_arch == "MixtralForCausalLM";
  const bool qwen3 = hf_arch == "Qwen3ForCausalLM" || qwen3_moe;
  const bool qwen_moe = qwen2_moe || qwen3_moe;
  c.intermediate_size = f.positive_int(qwen_moe ? "moe_intermediate_size" : "intermediate_size");
  c.max_positions = f.positive_int("max_position_embeddings");
  c.norm_eps = f.positive_float("rms_norm_eps");
  if (mixtral || qwen_moe) {
    // Every block is sparse: Qwen-MoE's dense layers (mlp_only_layers,
    // decoder_sparse_step > 1) are refused rather than run as experts.
    c.n_experts = f.positive_int(mixtral ? "num_local_experts" : "num_experts");
    c.experts_per_token = f.positive_int("num_experts_per_tok");
    if (c.experts_per_token > c.n_experts)
      f.fail("num_experts_per_tok", "(" + std::to_string(c.experts_per_token) + ") exceeds the number of experts (" +
                                        std::to_string(c.n_experts) + ")");
    c.norm_topk_prob = mixtral || f.boolean_or("norm_topk_prob", false);
    if (qwen_moe) {
      if (f.positive_int_or("decoder_sparse_step", 1) != 1)
        f.fail("decoder_sparse_step", "is not 1; dense MLP layers between sparse ones are not supported");
      if (f.has("mlp_only_layers") && !(j.at("mlp_only_layers").is_array() && j.at("mlp_only_layers").empty()))
        f.fail("mlp_only_layers", "is not empty; dense MLP layers between sparse ones are not supported");
    }
    if (f.has("router_jitter_noise") && j.at("router_jitter_noise").is_number() &&
        j.at("router_jitter_noise").get<double>() != 0)
      f.fail("router_jitter_noise", "is not 0; random jitter of the router's input is not supported");
    // Qwen2-MoE's shared expert (Qwen2MoeConfig's default width 5632; a
    // width of 0 adds nothing, as in HF). Other families have none.
    const bool shared_zero = f.has("shared_expert_intermediate_size") && j.at("shared_expert_intermediate_size") == 0;
    if (qwen2_moe && !shared_zero)
      c.shared_expert_size = f.positive_int_or("shared_expert_intermediate_size", 5632);
    else if (!qwen2_moe && f.has("shared_expert_intermediate_size") && !shared_zero)
      f.fail("shared_expert_intermediate_size", "is set; shared experts are Qwen2MoeForCausalLM's, not " + hf_arch + "'s");
  }
  c.rope = parse_rope_scaling(f, j, origin, f.positive_float_or("rope_theta", 10000.0f), c.head_dim,
                              c.max_positions);
  if (c.rope.kind != rope_kind::plain) {
    // Kept as written, for to_hf_json; yarn's default original context is
    // made explicit (to_hf_json writes a sliding window's capped context).
    json scaling = j.at("rope_scaling");
    if (c.rope.kind == rope_kind::yarn && !scaling.contains("original_max_position_embeddings"))
      scaling["original_max_position_embeddings"] = c.max_positions;
    c.rope_scaling = scaling.dump();
  }
  // Qwen2 and Qwen3 tie small models' embeddings and say so; HF's default
  // for both is untied, as for Llama.
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", false);

  std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", "is '" + act + "'; only 'silu' is supported");
  // Qwen2's q, k and v always have biases (o never); Llama and Qwen3 put
  // one on all four when attention_bias is true; Mistral has none.
  if (qwen2) {
    c.qkv_bias = !qwen2_moe || f.boolean_or("qkv_bias", true);  // Qwen2MoeConfig names it; Qwen2's are always on
  } else if (hf_arch != "MistralForCausalLM" && !mixtral && f.boolean_or("attention_bias", false)) {
    c.qkv_bias = c.o_bias = true;
  }
  c.qk_norm = qwen3;
  if (f.boolean_or("mlp_bias", false))
    f.fail("mlp_bias", "is true; MLP biases are not supported for " + hf_arch + " models");
  // A sliding window only changes attention for sequences longer than the
  // window; capping the context at the window keeps full attention exact.
  // Qwen2/3 configs carry a window they use only with use_sliding_window.
  const bool windowed = (qwen2 || qwen3) ? f.boolean_or("use_sliding_window", false) : true;
  if (windowed && f.has("sliding_window")) {
    int window = f.positive_int("sliding_window");
    if (window < c.max_positions) c.max_positions = window;
  }

  c.bos_token_id = f.token_id("bos_token_id");
  c.eos_token_id = f.token_id("eos_token_id");
  c.eos_token_ids = f.token_ids("eos_token_id");
  return c;
}

model_config parse_gpt2(const field_reader& f, const std::string& hf_arch) {
  model_config c;
  c.arch = architecture::gpt2;
  c.hf_architecture = hf_arch;
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("n_embd");
  c.n_layers = f.positive_int("n_layer");
  c.n_heads = f.positive_int("n_head");
  c.n_kv_heads = c.n_heads;
  if (c.hidden_size % c.n_heads != 0)
    f.fail("n_embd", "(" + std::to_string(c.hidden_size) + ") is not divisible by n_head (" +
                         std::to_string(c.n_heads) + ")");
  c.head_dim = c.hidden_size / c.n_heads;
  c.intermediate_size = f.positive_int_or("n_inner", 4 * c.hidden_size);
  c.max_positions = f.has("n_positions") ? f.positive_int("n_positions") : f.positive_int("n_ctx");
  c.norm_eps = f.positive_float_or("layer_norm_epsilon", 1e-5f);
  c.tie_embeddings = true;

  std::string act = f.string_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    f.fail("activation_function",
           "is '" + act +
               "'; only the tanh-approximated GELU is supported (gelu_new, gelu_pytorch_tanh, "
               "gelu_fast)");
  if (!f.boolean_or("scale_attn_weights", true))
    f.fail("scale_attn_weights", "is false; unscaled attention is not supported");
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false))
    f.fail("scale_attn_by_inverse_layer_idx", "is true; this attention scaling is not supported");

  c.bos_token_id = f.token_id("bos_token_id");
  c.eos_token_id = f.token_id("eos_token_id");
  c.eos_token_ids = f.token_ids("eos_token_id");
  return c;
}

/// The shortest decimal that reads back as `v`, so that 1e-5f is written
/// as 1e-05 and not as 9.99999974737875e-06.
double shortest(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::stod(std::string(buf, r.ptr));
}

std::string describe(const model_config& c) {
  return c.hf_architecture.empty() ? std::string("model config") : c.hf_architecture + " config";
}

}  // namespace

void model_config::validate() const {
  auto positive = [&](long long v, const char* what) {
    if (v <= 0)
      throw model_error(describe(*this) + ": " + what + " must be positive, got " +
                        std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden size");
  positive(n_layers, "number of layers");
  positive(n_heads, "number of attention heads");
  positive(n_kv_heads, "number of key/value heads");
  positive(head_dim, "head_dim");
  positive(intermediate_size, "intermediate size");
  positive(max_positions, "max positions");
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps))
    throw model_error(describe(*this) + ": norm epsilon must be positive, got " +
                      std::to_string(norm_eps));
  if (n_experts < 0 || (n_experts > 0 && (experts_per_token < 1 || experts_per_token > n_experts)))
    throw model_error(describe(*this) + ": " + std::to_string(experts_per_token) + " experts per token of " +
                      std::to_string(n_experts));
  if (n_experts > 0 && hf_architecture != "MixtralForCausalLM" && hf_architecture != "Qwen2MoeForCausalLM" &&
      hf_architecture != "Qwen3MoeForCausalLM")
    throw model_error(describe(*this) +
                      ": mixtures of experts are MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM models");
  if (shared_expert_size < 0 || (shared_expert_size > 0 && (n_experts == 0 || hf_architecture != "Qwen2MoeForCausalLM")))
    throw model_error(describe(*this) + ": a shared expert (width " + std::to_string(shared_expert_size) +
                      ") belongs to a Qwen2MoeForCausalLM mixture of experts");
  if (n_experts > 0 && hf_architecture == "MixtralForCausalLM" && !norm_topk_prob)
    throw model_error(describe(*this) + ": Mixtral always renormalises its top-k routing weights (norm_topk_prob)");
  // A prompt's BOS is embedded, and generation stops at an EOS: an id
  // outside the vocabulary could be neither.
  const auto in_vocabulary = [&](int id, const char* what) {
    if (id >= vocab_size)
      throw model_error(describe(*this) + ": " + what + " " + std::to_string(id) +
                        " is not a token of the vocabulary (vocab_size " + std::to_string(vocab_size) + ")");
  };
  in_vocabulary(bos_token_id, "bos_token_id");
  in_vocabulary(eos_token_id, "eos_token_id");
  for (int id : eos_token_ids) in_vocabulary(id, "eos_token_id");
  if (n_heads % n_kv_heads != 0)
    throw model_error(describe(*this) + ": number of attention heads (" + std::to_string(n_heads) +
                      ") is not divisible by the number of key/value heads (" +
                      std::to_string(n_kv_heads) + ")");
  if (arch == architecture::gpt2) {
    if (n_kv_heads != n_heads)
      throw model_error(describe(*this) + ": GPT-2 has no grouped-query attention (" +
                        std::to_string(n_kv_heads) + " key/value heads for " +
                        std::to_string(n_heads) + " heads)");
    if (static_cast<long long>(n_heads) * head_dim != hidden_size)
      throw model_error(describe(*this) + ": hidden size " + std::to_string(hidden_size) +
                        " is not heads x head_dim (" + std::to_string(n_heads) + " x " +
                        std::to_string(head_dim) + ")");
    if (!tie_embeddings)
      throw model_error(describe(*this) + ": GPT-2 always ties the LM head to the embeddings");
  } else {
    if (head_dim % 2 != 0)
      throw model_error(describe(*this) + ": head_dim " + std::to_string(head_dim) +
                        " must be even for rotary embeddings");
    if (!rope.valid())
      throw model_error(describe(*this) + ": rope_theta and the rope_scaling factors must be positive");
  }
}

long long model_config::parameter_count() const {
  const long long V = vocab_size, D = hidden_size, F = intermediate_size, P = max_positions;
  const long long q = static_cast<long long>(n_heads) * head_dim;
  const long long kv = static_cast<long long>(n_kv_heads) * head_dim;
  if (arch == architecture::gpt2) {
    // ln_1, c_attn (+bias), c_proj (+bias), ln_2, c_fc (+bias), mlp c_proj (+bias)
    long long block = 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + 2 * D + (D * F + F) + (F * D + D);
    return V * D + P * D + n_layers * block + 2 * D;
  }
  // input norm, q/k/v/o (and their biases), q/k norms, post-attention norm, gate/up/down
  long long block = D + D * q + 2 * D * kv + q * D + D + 3 * D * F * std::max(1, n_experts);
  if (n_experts > 0) block += static_cast<long long>(n_experts) * D;  // the router
  if (shared_expert_size > 0) block += 3 * D * shared_expert_size + D;  // the shared expert and its gate
  if (qkv_bias) block += q + 2 * kv;
  if (o_bias) block += D;
  if (qk_norm) block += 2LL * head_dim;
  return V * D + n_layers * block + D + (tie_embeddings ? 0 : V * D);
}

model_config parse_config(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) throw model_error(origin + " is not a JSON object");
  field_reader f(j, origin);

  std::string arch;
  if (j.contains("architectures") && !j.at("architectures").is_null()) {
    const json& a = j.at("architectures");
    if (!a.is_array() || a.empty() || !a.at(0).is_string())
      f.fail("architectures", "must be a non-empty list of names, got " + a.dump());
    arch = a.at(0).get<std::string>();
  } else {
    std::string type = f.string_or("model_type", "");
    if (type == "llama") arch = "LlamaForCausalLM";
    else if (type == "mistral") arch = "MistralForCausalLM";
    else if (type == "qwen2") arch = "Qwen2ForCausalLM";
    else if (type == "qwen3") arch = "Qwen3ForCausalLM";
    else if (type == "mixtral") arch = "MixtralForCausalLM";
    else if (type == "qwen2_moe") arch = "Qwen2MoeForCausalLM";
    else if (type == "qwen3_moe") arch = "Qwen3MoeForCausalLM";
    else if (type == "gpt2") arch = "GPT2LMHeadModel";
    else arch = type.empty() ? std::string("(none: no architectures or model_type)") : type;
  }

  model_config c;
  if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM" ||
      arch == "Qwen3ForCausalLM" || arch == "MixtralForCausalLM" || arch == "Qwen2MoeForCausalLM" ||
      arch == "Qwen3MoeForCausalLM")
    c = parse_llama(f, j, origin, arch);
  else if (arch == "GPT2LMHeadModel")
    c = parse_gpt2(f, arch);
  else
    throw model_error("unsupported architecture '" + arch + "' in " + origin + " (supported: " +
                      kSupported + ")");
  try {
    c.validate();
  } catch (const model_error& e) {
    throw model_error(std::string(e.what()) + " (in " + origin + ")");
  }
  return c;
}

model_config load_config(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw model_error("model directory " + path.string() + " does not exist");
  fs::path file = fs::is_directory(path, ec) ? path / "config.json" : path;
  if (!fs::is_regular_file(file, ec))
    throw model_error("no config.json in " + path.string());
  model_config c = parse_config(read_json_file(file), file.string());
  // generation_config.json's end-of-sequence ids (an int or a list) join
  // config.json's: Llama 3.1 instruct lists <|eot_id|> only there.
  const fs::path gen = file.parent_path() / "generation_config.json";
  if (fs::is_regular_file(gen, ec)) {
    const json gj = read_json_file(gen);
    if (!gj.is_object()) throw model_error(gen.string() + " is not a JSON object");
    for (int id : field_reader(gj, gen.string()).token_ids("eos_token_id"))
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
    if (c.eos_token_id < 0 && !c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
    try {
      c.validate();  // the ids it added
    } catch (const model_error& e) {
      throw model_error(std::string(e.what()) + " (in " + gen.string() + ")");
    }
  }
  return c;
}

nlohmann::json to_hf_json(const model_config& c) {
  json j;
  if (c.arch == architecture::gpt2) {
    j["architectures"] = json::array({"GPT2LMHeadModel"});
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.n_layers;
    j["n_head"] = c.n_heads;
    j["n_inner"] = c.intermediate_size;
    j["n_positions"] = c.max_positions;
    j["n_ctx"] = c.max_positions;
    j["layer_norm_epsilon"] = shortest(c.norm_eps);
    j["activation_function"] = "gelu_new";
    j["tie_word_embeddings"] = true;
    // Dropout is a training-time choice HF would otherwise default to 0.1.
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
  } else {
    const std::string& h = c.hf_architecture;
    const std::string arch = h == "MistralForCausalLM" || h == "Qwen2ForCausalLM" || h == "Qwen3ForCausalLM" ||
                                     h == "MixtralForCausalLM" || h == "Qwen2MoeForCausalLM" ||
                                     h == "Qwen3MoeForCausalLM"
                                 ? h
                                 : std::string("LlamaForCausalLM");
    j["architectures"] = json::array({arch});
    j["model_type"] = arch == "MistralForCausalLM"    ? "mistral"
                      : arch == "Qwen2ForCausalLM"    ? "qwen2"
                      : arch == "Qwen3ForCausalLM"    ? "qwen3"
                      : arch == "MixtralForCausalLM"  ? "mixtral"
                      : arch == "Qwen2MoeForCausalLM" ? "qwen2_moe"
                      : arch == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                                                      : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_positions;
    j["rms_norm_eps"] = shortest(c.norm_eps);
    j["rope_theta"] = shortest(static_cast<float>(c.rope.theta));
    j["rope_scaling"] = c.rope_scaling.empty() ? json(nullptr) : json::parse(c.rope_scaling);
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["hidden_act"] = "silu";
    if (arch == "Qwen2MoeForCausalLM") j["qkv_bias"] = c.qkv_bias;
    else if (arch != "Qwen2ForCausalLM") j["attention_bias"] = c.o_bias;
    j["mlp_bias"] = false;
    if (arch == "MistralForCausalLM" || arch == "MixtralForCausalLM") j["sliding_window"] = nullptr;
    if (arch == "MixtralForCausalLM") {
      j["num_local_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.experts_per_token;
      j["output_router_logits"] = false;  // the loss is the LM loss alone (no auxiliary balancing loss)
    } else if (arch == "Qwen2MoeForCausalLM" || arch == "Qwen3MoeForCausalLM") {
      if (arch == "Qwen2MoeForCausalLM") j["shared_expert_intermediate_size"] = c.shared_expert_size;
      j["num_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.experts_per_token;
      j["moe_intermediate_size"] = c.intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = json::array();
      j["output_router_logits"] = false;
    }
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  else if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = "float32";
  return j;
}

}  // namespace corolla
