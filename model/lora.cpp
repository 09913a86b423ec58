// LoRA adapters (model/lora.hpp).
#include "model/lora.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "model/block.hpp"
#include "model/block_ops.hpp"
#include "model/error.hpp"
#include "model/fingerprint.hpp"
#include "model/json_file.hpp"
#include "model/safetensors.hpp"
#include "model/transformer.hpp"
#include "model/whole_file.hpp"
#include "model/workspace.hpp"

namespace corolla {

namespace {

using json = nlohmann::json;
using block_ops::is_llama;
using block_ops::kv_width;
using block_ops::q_width;

const char* const config_file = "adapter_config.json";
const char* const weights_file = "adapter_model.safetensors";

/// "model.layers.3." / "transformer.h.3.": where a layer's modules live.
std::string layer_prefix(const model_config& cfg, int layer) {
  return (is_llama(cfg) ? "model.layers." : "transformer.h.") + std::to_string(layer) + ".";
}

/// PEFT's key of one adapter tensor: which = "lora_A" or "lora_B".
std::string peft_key(const model_config& cfg, int layer, const std::string& module, const char* which) {
  return "base_model.model." + layer_prefix(cfg, layer) + module + "." + which + ".weight";
}

std::vector<std::string> default_targets(const model_config& cfg) {
  if (is_llama(cfg)) return {"q_proj", "v_proj"};
  return {"c_attn"};
}

/// Whether target `t` names module `path` (its whole path or its last parts).
bool names(const std::string& t, const std::string& path) {
  return t == path || (path.size() > t.size() && path.ends_with(t) && path[path.size() - t.size() - 1] == '.');
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

shape_t a_shape(const lora_module& m, int r) { return {r, m.in}; }
shape_t b_shape(const lora_module& m, int r) { return {m.out, r}; }

/// The tensors of one block of an adapter of `modules` and rank `r`.
std::vector<std::pair<std::string, shape_t>> block_layout_of(const std::vector<lora_module>& modules, int r) {
  std::vector<std::pair<std::string, shape_t>> layout;
  for (const lora_module& m : modules) {
    layout.emplace_back(m.path + ".lora_A", a_shape(m, r));
    layout.emplace_back(m.path + ".lora_B", b_shape(m, r));
  }
  return layout;
}

/// Values in one block of an adapter of `modules` and rank `r`.
std::int64_t block_numel_of(const std::vector<lora_module>& modules, int r) {
  std::int64_t n = 0;
  for (const auto& entry : block_layout_of(modules, r)) n += shape_numel(entry.second);
  return n;
}

/// Blocks [first, first + n) of `sets`' tensors in `layout`'s order, block
/// after block (views): what span_values lays out flat.
std::vector<Tensor> span_tensors(const std::vector<param_set>& sets, int first, int n,
                                 const std::vector<std::pair<std::string, shape_t>>& layout) {
  std::vector<Tensor> out;
  for (int i = first; i < first + n; ++i)
    for (const auto& entry : layout) out.push_back(sets.at(static_cast<std::size_t>(i)).get(entry.first));
  return out;
}

void check_config(const lora_config& c) {
  if (c.rank < 1) throw model_error("a LoRA adapter's rank must be at least 1 (got " + std::to_string(c.rank) + ")");
  if (!std::isfinite(c.alpha) || c.alpha <= 0.0f)
    throw model_error("a LoRA adapter's alpha must be a finite number > 0 (got " + std::to_string(c.alpha) + ")");
}

}  // namespace

std::string lora_config::targets_text() const { return joined(targets); }

float lora_config::scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<float>(rank)) : alpha / static_cast<float>(rank);
}

std::vector<lora_module> lora_modules(const model_config& cfg) {
  const std::int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  const std::int64_t Q = q_width(cfg), KV = kv_width(cfg);
  if (!is_llama(cfg))
    return {{"attn.c_attn", D, Q + 2 * KV, {{"q.weight", Q}, {"k.weight", KV}, {"v.weight", KV}}},
            {"attn.c_proj", Q, D, {{"o.weight", D}}},
            {"mlp.c_fc", D, F, {{"up.weight", F}}},
            {"mlp.c_proj", F, D, {{"down.weight", D}}}};
  std::vector<lora_module> m = {{"self_attn.q_proj", D, Q, {{"q.weight", Q}}},
                                {"self_attn.k_proj", D, KV, {{"k.weight", KV}}},
                                {"self_attn.v_proj", D, KV, {{"v.weight", KV}}},
                                {"self_attn.o_proj", Q, D, {{"o.weight", D}}}};
  if (!cfg.is_moe())
    m.insert(m.end(), {{"mlp.gate_proj", D, F, {{"gate.weight", F}}},
                       {"mlp.up_proj", D, F, {{"up.weight", F}}},
                       {"mlp.down_proj", F, D, {{"down.weight", D}}}});
  return m;
}

std::vector<lora_module> lora_targets(const model_config& cfg, const std::vector<std::string>& targets) {
  const std::vector<lora_module> all = lora_modules(cfg);
  const std::vector<std::string> wanted = targets.empty() ? default_targets(cfg) : targets;
  std::set<std::string> chosen;
  for (const std::string& t : wanted) {
    bool matched = false;
    for (const lora_module& m : all)
      if (t == "all-linear" || names(t, m.path)) {
        chosen.insert(m.path);
        matched = true;
      }
    if (!matched) {
      std::vector<std::string> paths;
      for (const lora_module& m : all) paths.push_back(m.path);
      throw model_error("LoRA target '" + t + "' names no module of this " + cfg.hf_architecture +
                        (cfg.is_moe() ? " (a mixture of experts' MLP is not adapted)" : "") + "; there are " +
                        joined(paths) + ", and all-linear");
    }
  }
  std::vector<lora_module> out;
  for (const lora_module& m : all)
    if (chosen.count(m.path)) out.push_back(m);
  return out;
}

lora_adapter::lora_adapter(const model_config& cfg, lora_config c, std::vector<lora_module> modules)
    : cfg_(cfg), config_(std::move(c)), modules_(std::move(modules)) {
  config_.targets.clear();  // by their paths, however they were named
  for (const lora_module& m : modules_) config_.targets.push_back(m.path);
  std::vector<std::pair<std::string, shape_t>> layout;
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    std::int64_t row = 0;
    for (const auto& [name, rows] : modules_[i].parts) {
      parts_[name] = {i, row, rows};
      row += rows;
    }
  }
  layout = block_layout_of(modules_, config_.rank);
  blocks_.reserve(static_cast<std::size_t>(cfg.n_layers));
  for (int i = 0; i < cfg.n_layers; ++i) blocks_.emplace_back(layout);  // zeroed, on the host
}

std::vector<std::pair<std::string, shape_t>> lora_block_layout(const model_config& cfg, const lora_config& c) {
  check_config(c);
  return block_layout_of(lora_targets(cfg, c.targets), c.rank);
}

lora_adapter lora_adapter::zeros(const model_config& cfg, lora_config c) {
  check_config(c);
  std::vector<lora_module> modules = lora_targets(cfg, c.targets);
  return lora_adapter(cfg, std::move(c), std::move(modules));
}

lora_adapter lora_adapter::init(const model_config& cfg, lora_config c, std::uint64_t seed, Backend& be) {
  check_config(c);
  std::vector<lora_module> modules = lora_targets(cfg, c.targets);
  lora_adapter a(cfg, std::move(c), std::move(modules));
  std::mt19937_64 rng(seed);
  for (param_set& p : a.blocks_)
    for (const lora_module& m : a.modules_) {
      // B stays zero (the set is zeroed): the adapted model starts as the base.
      Tensor A = p.get(m.path + ".lora_A");
      std::uniform_real_distribution<float> u(-1.0f / std::sqrt(static_cast<float>(m.in)),
                                              1.0f / std::sqrt(static_cast<float>(m.in)));
      float* v = A.data<float>();
      for (std::int64_t i = 0; i < A.numel(); ++i) v[i] = u(rng);
    }
  for (param_set& p : a.blocks_) place_params(p, be);
  return a;
}

lora_adapter lora_adapter::of_span(const model_config& cfg, const lora_span_values& v, int n, Backend& be) {
  check_config(v.config);
  if (v.config.rank > max_carried_lora_rank)
    throw model_error("a carried LoRA adapter's rank must be at most " + std::to_string(max_carried_lora_rank) +
                      " (got " + std::to_string(v.config.rank) + ")");
  if (n < 1) throw model_error("a carried LoRA adapter needs at least one block");
  std::vector<lora_module> modules = lora_targets(cfg, v.config.targets);
  // Checked before anything is allocated: the values bound what is made.
  const std::int64_t per_block = block_numel_of(modules, v.config.rank);
  const Tensor& t = v.values;
  if (!t.defined() || t.type() != dtype::f32 || t.dev().kind != device_kind::cpu || t.shape().size() != 1 ||
      t.numel() != per_block * n)
    throw model_error("a carried LoRA adapter of rank " + std::to_string(v.config.rank) + " over " +
                      std::to_string(n) + " blocks needs f32 [" + std::to_string(per_block * n) +
                      "] on the host, got " +
                      (t.defined() ? std::string(dtype_name(t.type())) + " " + shape_str(t.shape()) + " on " + t.dev().str()
                                   : std::string("none")));
  model_config span_cfg = cfg;
  span_cfg.n_layers = n;
  lora_adapter a(span_cfg, v.config, std::move(modules));
  a.set_span_values(0, n, t);
  for (param_set& p : a.blocks_) place_params(p, be);
  return a;
}

lora_adapter lora_adapter::load(const std::filesystem::path& dir, const model_config& cfg, Backend& be) {
  const std::filesystem::path cfg_path = dir / config_file, w_path = dir / weights_file;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw model_error("LoRA adapter directory " + dir.string() + " does not exist");
  const json j = read_json_file(cfg_path);
  const auto refuse = [&](const std::string& why) { throw model_error(cfg_path.string() + ": " + why); };
  if (!j.is_object()) refuse("not a JSON object");
  lora_config c;
  try {
    if (j.value("peft_type", std::string()) != "LORA")
      refuse("peft_type is " + (j.contains("peft_type") ? j["peft_type"].dump() : std::string("missing")) +
             ", not \"LORA\"");
    c.rank = j.at("r").get<int>();
    c.alpha = j.value("lora_alpha", 8.0f);  // PEFT's default
    c.rslora = j.value("use_rslora", false);
    const json& t = j.at("target_modules");
    if (t.is_string()) {
      if (t.get<std::string>() != "all-linear")
        refuse("target_modules as a regular expression is not supported (give a list of module names)");
      c.targets = {"all-linear"};
    } else {
      c.targets = t.get<std::vector<std::string>>();
    }
    const auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
    const auto nonempty = [&](const char* key) { return present(key) && !j[key].empty(); };
    if (present("use_dora") && j["use_dora"].get<bool>()) refuse("DoRA adapters (use_dora) are not supported");
    if (nonempty("rank_pattern") || nonempty("alpha_pattern"))
      refuse("per-module ranks or alphas (rank_pattern, alpha_pattern) are not supported");
    if (present("layers_to_transform")) refuse("layers_to_transform is not supported: every layer is adapted");
    if (nonempty("modules_to_save")) refuse("modules_to_save (fully trained modules) is not supported");
    if (present("bias") && j["bias"].get<std::string>() != "none")
      refuse("trained biases (bias != \"none\") are not supported");
  } catch (const json::exception& e) {
    refuse(std::string("malformed: ") + e.what());
  }
  try {
    check_config(c);
  } catch (const model_error& e) {
    refuse(e.what());
  }
  lora_adapter a(cfg, c, lora_targets(cfg, c.targets));
  auto file = safetensors_file::open(w_path);
  std::set<std::string> expected;
  for (int layer = 0; layer < cfg.n_layers; ++layer)
    for (const lora_module& m : a.modules_)
      for (const char* which : {"lora_A", "lora_B"}) {
        const std::string key = peft_key(cfg, layer, m.path, which);
        expected.insert(key);
        const tensor_info* ti = file->find(key);
        if (!ti) throw model_error("tensor " + key + " missing from " + w_path.string());
        Tensor dst = a.blocks_[static_cast<std::size_t>(layer)].get(m.path + "." + which);
        if (ti->shape != dst.shape())
          throw model_error("tensor " + key + " in " + w_path.string() + " has shape " + shape_str(ti->shape) +
                            ", expected " + shape_str(dst.shape()) + " (r = " + std::to_string(c.rank) + ")");
        const Tensor src = file->view(key);
        if (src.type() == dtype::f32)
          dst.copy_from(src);
        else if (src.type() == dtype::bf16 || src.type() == dtype::f16)
          dst.copy_from(src.to(dtype::f32));
        else
          throw model_error("tensor " + key + " in " + w_path.string() + " is " + dtype_name(src.type()) +
                            ", not a float type");
      }
  for (const auto& [name, info] : file->tensors())
    if (!expected.count(name))
      throw model_error(w_path.string() + " holds " + name +
                        ", which adapts no module this adapter's targets name in this model (" +
                        std::to_string(cfg.n_layers) + " layers)");
  for (param_set& p : a.blocks_) place_params(p, be);
  return a;
}

void lora_adapter::save(const std::filesystem::path& dir, const std::string& base_model) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw model_error("cannot create " + dir.string() + ": " + ec.message());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int layer = 0; layer < n_layers(); ++layer)
    for (const lora_module& m : modules_)
      for (const char* which : {"lora_A", "lora_B"}) {
        const Tensor t = block(layer).get(m.path + "." + which);
        Tensor host = Tensor::empty(t.shape());
        host.copy_from(t);
        tensors.emplace_back(peft_key(cfg_, layer, m.path, which), std::move(host));
      }
  write_safetensors(dir / weights_file, tensors, {{"format", "pt"}});
  // A module by its last name where that names it alone among the model's
  // (PEFT matches the last parts): GPT-2's two c_proj by their paths.
  const std::vector<lora_module> all = lora_modules(cfg_);
  std::vector<std::string> short_names;
  for (const lora_module& m : modules_) {
    const std::string last = m.path.substr(m.path.rfind('.') + 1);
    const auto same_last = std::count_if(all.begin(), all.end(), [&](const lora_module& o) { return names(last, o.path); });
    short_names.push_back(same_last == 1 ? last : m.path);
  }
  const json j = {{"peft_type", "LORA"},
                  {"task_type", "CAUSAL_LM"},
                  {"base_model_name_or_path", base_model},
                  {"r", config_.rank},
                  {"lora_alpha", config_.alpha},
                  {"use_rslora", config_.rslora},
                  {"target_modules", short_names},
                  {"lora_dropout", 0.0},
                  {"bias", "none"},
                  {"fan_in_fan_out", !is_llama(cfg_)},
                  {"use_dora", false},
                  {"inference_mode", true},
                  {"modules_to_save", nullptr},
                  {"layers_to_transform", nullptr},
                  {"init_lora_weights", true}};
  write_whole_file(dir / config_file, j.dump(2) + "\n");
}

std::int64_t lora_adapter::numel() const {
  std::int64_t n = 0;
  for (const param_set& p : blocks_)
    for (const param_entry& e : p.entries()) n += e.numel;
  return n;
}

std::vector<param_group> lora_adapter::groups() {
  if (grads_.empty())
    for (const param_set& p : blocks_) grads_.push_back(p.like());
  std::vector<param_group> g;
  for (std::size_t i = 0; i < blocks_.size(); ++i) g.push_back({&blocks_[i], &grads_[i]});
  return g;
}

void lora_adapter::merge(Backend& be, int layer, param_set& w) const {
  const float s = config_.scaling();
  const param_set& p = block(layer);
  for (const lora_module& m : modules_) {
    const Tensor A = p.get(m.path + ".lora_A"), B = p.get(m.path + ".lora_B");
    std::int64_t row = 0;
    for (const auto& [name, rows] : m.parts) {
      Tensor W = w.get(name);
      be.gemm(B.slice(row, row + rows), false, A, false, W, s, 1.0f);
      row += rows;
    }
  }
}

namespace {

/// The role of block_lora that block_layout weight `name` is.
lora_factors block_lora::*lora_role(const std::string& name) {
  // block_layout's names of lora_roles, in their order.
  static const char* const names[] = {"q.weight", "k.weight", "v.weight", "o.weight",
                                      "gate.weight", "up.weight", "down.weight"};
  static_assert(std::size(names) == std::size(lora_roles));
  for (std::size_t i = 0; i < std::size(names); ++i)
    if (name == names[i]) return lora_roles[i];
  throw model_error("LoRA: no linear role for block weight " + name);
}

/// `host` copied to be's device.
Tensor on_device(Backend& be, const Tensor& host) {
  Tensor t = be.empty(host.shape());
  be.copy(host, t);
  return t;
}

/// Blocks [first, first + n) of `a` as factors beside frozen weights, block
/// first+i at index i, each A and B as `place` gives it (A shared by the
/// parts of a stacked module, B's rows split among them).
template <class Place>
span_lora factors_of(const lora_adapter& a, int first, int n, Place&& place) {
  const float s = a.config().scaling();
  span_lora out;
  out.blocks.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const param_set& p = a.block(first + i);
    for (const lora_module& m : a.modules()) {
      const Tensor A = place(p.get(m.path + ".lora_A")), B = place(p.get(m.path + ".lora_B"));
      std::int64_t row = 0;
      for (const auto& [name, rows] : m.parts) {
        out.blocks[static_cast<std::size_t>(i)].*lora_role(name) = {A, B.slice(row, row + rows), s};
        row += rows;
      }
    }
  }
  return out;
}

void check_blocks(int first, int n, int layers) {
  if (first < 0 || n < 0 || first + n > layers)
    throw model_error("LoRA: blocks [" + std::to_string(first) + ", " + std::to_string(first + n) +
                      ") are not blocks of an adapter of " + std::to_string(layers));
}

}  // namespace

span_lora lora_adapter::factors(Backend& be, int first, int n) const {
  check_blocks(first, n, n_layers());
  return factors_of(*this, first, n, [&](const Tensor& host) { return on_device(be, host); });
}

span_lora lora_adapter::training_factors(Backend& be, dtype t, int first, int n) const {
  check_blocks(first, n, n_layers());
  return factors_of(*this, first, n, [&](const Tensor& x) {
    if (x.type() == t) return x;
    Tensor out = be.empty(x.shape(), t);
    be.copy(x, out);
    return out;
  });
}

std::int64_t lora_adapter::block_numel() const { return block_numel_of(modules_, config_.rank); }

Tensor lora_adapter::span_values(int first, int n, bool grads) {
  check_blocks(first, n, n_layers());
  if (grads && grads_.empty()) zero_grads();
  Tensor out = Tensor::empty({block_numel() * n});
  std::int64_t at = 0;
  for (const Tensor& t : span_tensors(grads ? grads_ : blocks_, first, n, block_layout_of(modules_, config_.rank))) {
    out.slice(at, at + t.numel()).view(t.shape()).copy_from(t);
    at += t.numel();
  }
  return out;
}

void lora_adapter::set_span_values(int first, int n, const Tensor& flat, bool grads) {
  check_blocks(first, n, n_layers());
  if (flat.numel() != block_numel() * n)
    throw model_error("LoRA: " + std::to_string(flat.numel()) + " values for " + std::to_string(n) +
                      " blocks of " + std::to_string(block_numel()));
  if (grads && grads_.empty()) zero_grads();
  const Tensor src = flat.view({flat.numel()});
  std::int64_t at = 0;
  for (Tensor& t : span_tensors(grads ? grads_ : blocks_, first, n, block_layout_of(modules_, config_.rank))) {
    t.copy_from(src.slice(at, at + t.numel()).view(t.shape()));
    at += t.numel();
  }
}

std::string lora_adapter::digest() const {
  fingerprint f;
  f.mix(&config_.rank, sizeof config_.rank);
  f.mix(&config_.alpha, sizeof config_.alpha);
  const unsigned char rs = config_.rslora ? 1 : 0;
  f.mix(&rs, 1);
  for (const lora_module& m : modules_) f.mix(m.path.data(), m.path.size() + 1);
  for (const param_set& p : blocks_) f.mix(p.flat().raw(), p.flat().nbytes());
  return f.hex();
}

void lora_adapter::apply(const model_config& cfg, int layer, param_set& w) const {
  if (!fits(cfg))
    throw model_error("this LoRA adapter was made for another model (" + std::to_string(n_layers()) +
                      " layers of width " + std::to_string(cfg_.hidden_size) + ")");
  if (w.flat().dev().kind != device_kind::cpu || block(layer).flat().dev().kind != device_kind::cpu)
    throw tensor_error("lora_adapter::apply merges on the host: load the adapter on the CPU backend");
  merge(cpu_backend(), layer, w);
}

namespace {

/// A [shape] view of dtype `act` at the start of `buffer`, which grows (and
/// only grows) to hold it: add()'s scratch, whose shapes change from one
/// module to the next.
Tensor scratch(Backend& be, Tensor& buffer, const shape_t& shape, dtype act) {
  const std::int64_t n = shape_numel(shape);
  if (!buffer.defined() || buffer.type() != act || buffer.numel() < n) buffer = be.empty({n}, act);
  return buffer.slice(0, n).view(shape);
}

/// `t` in dtype `act`: `t` itself, or converted into scratch of `buffer`.
Tensor in_dtype(Backend& be, const Tensor& t, dtype act, Tensor& buffer) {
  if (t.type() == act) return t;
  Tensor out = scratch(be, buffer, t.shape(), act);
  be.copy(t, out);
  return out;
}

}  // namespace

void lora_adapter::add(Backend& be, int layer, const std::string& weight, const Tensor& x, const Tensor& dy) {
  const auto it = parts_.find(weight);
  if (it == parts_.end()) return;  // frozen, and not adapted
  if (grads_.empty()) groups();
  const part& pt = it->second;
  const lora_module& m = modules_[pt.module];
  const float s = config_.scaling();
  const param_set& p = block(layer);
  param_set& g = grads_.at(static_cast<std::size_t>(layer));
  const Tensor A = p.get(m.path + ".lora_A"), B = p.get(m.path + ".lora_B").slice(pt.row, pt.row + pt.rows);
  Tensor dA = g.get(m.path + ".lora_A"), dB = g.get(m.path + ".lora_B").slice(pt.row, pt.row + pt.rows);
  const dtype act = x.type();
  const std::int64_t N = x.dim(0);
  Tensor t = scratch(be, t_, {N, config_.rank}, act), u = scratch(be, u_, {N, config_.rank}, act);
  be.gemm(x, false, in_dtype(be, A, act, a_act_), true, t);  // x A^T  [N, r]
  be.gemm(dy, true, t, false, dB, s, 1.0f);                   // dB += s dy^T (x A^T)  [rows, r]
  be.gemm(dy, false, in_dtype(be, B, act, b_act_), false, u);  // dy B  [N, r]
  be.gemm(u, true, x, false, dA, s, 1.0f);                    // dA += s (dy B)^T x  [r, in]
}

bool lora_adapter::fits(const model_config& cfg) const {
  if (cfg.n_layers != n_layers()) return false;
  const std::vector<lora_module> all = lora_modules(cfg);
  for (const lora_module& m : modules_) {
    const auto same = std::find_if(all.begin(), all.end(), [&](const lora_module& o) { return o.path == m.path; });
    if (same == all.end() || same->in != m.in || same->out != m.out) return false;
  }
  return true;
}

void lora_adapter::zero_grads() {
  if (grads_.empty()) groups();
  for (param_set& g : grads_) g.flat().zero();
}

// ---- training ----------------------------------------------------------------

lora_tuning::lora_tuning(transformer& model, lora_adapter& adapter) : model_(&model), adapter_(&adapter) {
  if (!adapter.fits(model.config()))
    throw model_error("the LoRA adapter was made for another model than this " + model.config().hf_architecture +
                      " of " + std::to_string(model.config().n_layers) + " layers");
  adapter.zero_grads();
  make_factors();
  // No weight of the model trains (nor gets a gradient buffer): the adapted
  // ones hand their inputs and output gradients to the adapter instead, and
  // compute with its terms.
  model.set_trained_weights(std::set<std::string>{}, &adapter, &factors_);
}

lora_tuning::~lora_tuning() {
  model_->set_trained_weights(std::nullopt);
  // Inference weights (QLoRA) stay as they are: the adapter is the result;
  // the block of f32 its passes widened into goes.
  if (model_->inference_only()) {
    model_->release_frozen_weights();
    return;
  }
  // The trained model: the adapter merged into the weights it trained beside.
  try {
    Backend& be = model_->backend();
    std::vector<param_set>& blocks = model_->blocks();
    for (std::size_t i = 0; i < blocks.size(); ++i) adapter_->merge(be, static_cast<int>(i), blocks[i]);
    model_->params_changed();
  } catch (const std::exception& e) {
    spdlog::error("LoRA: the trained adapter could not be merged into the model's weights: {}", e.what());
  }
}

void lora_tuning::make_factors() {
  factors_dtype_ = model_->compute_dtype();
  factors_ = adapter_->training_factors(model_->backend(), factors_dtype_);
}

void lora_tuning::zero_grads() {
  adapter_->zero_grads();
  if (model_->compute_dtype() != factors_dtype_) make_factors();
}

void lora_tuning::refresh() {
  if (factors_dtype_ != dtype::f32 || model_->compute_dtype() != factors_dtype_) make_factors();
}

}  // namespace corolla
