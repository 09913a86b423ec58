#include "model/hf_names.hpp"

#include <cstring>

namespace corolla {
namespace {

// ---- layouts ------------------------------------------------------------------------

/// dst[c, r] = src[r, col0 + c] for r < rows, c < cols: columns [col0, col0+cols)
/// of a [rows, src_cols] Conv1D weight become an [out, in] Linear weight.
void take_columns_transposed(const float* src, std::int64_t rows, std::int64_t src_cols,
                             std::int64_t col0, std::int64_t cols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * src_cols + col0;
    for (std::int64_t c = 0; c < cols; ++c) dst[c * rows + r] = s[c];
  }
}

/// The inverse: dst[r, col0 + c] = src[c, r] for a [cols, rows] Linear weight
/// written into columns of a [rows, dst_cols] Conv1D weight.
void put_columns_transposed(const float* src, std::int64_t rows, std::int64_t dst_cols,
                            std::int64_t col0, std::int64_t cols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * dst_cols + col0;
    for (std::int64_t c = 0; c < cols; ++c) d[c] = src[c * rows + r];
  }
}

void copy_floats(const Tensor& src, Tensor dst, std::int64_t src_offset = 0) {
  std::memcpy(dst.data<float>(), src.data<float>() + src_offset,
              static_cast<std::size_t>(dst.numel()) * sizeof(float));
}

// ---- Llama ----------------------------------------------------------------------------

/// A mixture-of-experts tensor's name: Mixtral's block_sparse_moe.gate and
/// experts.E.w1 (gate) / w3 (up) / w2 (down), Qwen-MoE's mlp.gate and
/// experts.E.gate_proj / up_proj / down_proj, and Qwen2-MoE's
/// mlp.shared_expert.*_proj and mlp.shared_expert_gate. Empty for other
/// tensors.
std::string moe_name(const model_config& cfg, const std::string& p, const std::string& canonical) {
  const bool mixtral = cfg.hf_architecture == "MixtralForCausalLM";
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  if (canonical == "router.weight") return moe + "gate.weight";
  if (canonical == "shared_gate.weight") return moe + "shared_expert_gate.weight";
  std::string expert, role;
  if (canonical.rfind("shared.", 0) == 0) {
    expert = "shared_expert.";
    role = canonical.substr(7);
  } else if (canonical.rfind("experts.", 0) == 0) {
    const std::size_t dot = canonical.find('.', 8);
    if (dot == std::string::npos) return {};
    expert = canonical.substr(0, dot + 1);
    role = canonical.substr(dot + 1);
  } else {
    return {};
  }
  const char* name = role == "gate.weight" ? (mixtral ? "w1.weight" : "gate_proj.weight")
                     : role == "up.weight" ? (mixtral ? "w3.weight" : "up_proj.weight")
                     : role == "down.weight" ? (mixtral ? "w2.weight" : "down_proj.weight")
                                             : nullptr;
  return name ? moe + expert + name : std::string();
}

std::string llama_block_name(const model_config& cfg, int layer, const std::string& canonical) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  if (cfg.is_moe())
    if (std::string name = moe_name(cfg, p, canonical); !name.empty()) return name;
  if (canonical == "attn_norm.weight") return p + "input_layernorm.weight";
  if (canonical == "mlp_norm.weight") return p + "post_attention_layernorm.weight";
  if (canonical == "q.weight") return p + "self_attn.q_proj.weight";
  if (canonical == "k.weight") return p + "self_attn.k_proj.weight";
  if (canonical == "v.weight") return p + "self_attn.v_proj.weight";
  if (canonical == "o.weight") return p + "self_attn.o_proj.weight";
  if (canonical == "gate.weight") return p + "mlp.gate_proj.weight";
  if (canonical == "up.weight") return p + "mlp.up_proj.weight";
  if (canonical == "down.weight") return p + "mlp.down_proj.weight";
  if (canonical == "q.bias") return p + "self_attn.q_proj.bias";
  if (canonical == "k.bias") return p + "self_attn.k_proj.bias";
  if (canonical == "v.bias") return p + "self_attn.v_proj.bias";
  if (canonical == "o.bias") return p + "self_attn.o_proj.bias";
  if (canonical == "q_norm.weight") return p + "self_attn.q_norm.weight";
  if (canonical == "k_norm.weight") return p + "self_attn.k_norm.weight";
  throw tensor_error("no HuggingFace Llama name for block tensor '" + canonical + "'");
}

std::string llama_head_name(const std::string& canonical) {
  if (canonical == "embed.weight") return "model.embed_tokens.weight";
  if (canonical == "final_norm.weight") return "model.norm.weight";
  if (canonical == "lm_head.weight") return "lm_head.weight";
  throw tensor_error("no HuggingFace Llama name for head tensor '" + canonical + "'");
}

// ---- GPT-2 ----------------------------------------------------------------------------

/// GPT-2 checkpoints name tensors with or without the "transformer." prefix
/// (the original release vs save_pretrained of GPT2LMHeadModel): take
/// whichever is there; the bare name goes into the error when neither is.
std::string gpt2_resolve(const checkpoint& ck, const std::string& bare) {
  if (ck.has(bare)) return bare;
  std::string prefixed = "transformer." + bare;
  if (ck.has(prefixed)) return prefixed;
  return bare;
}

/// The tensors GPT-2 keeps as they are (norms, biases other than c_attn's).
const char* gpt2_block_direct(const std::string& canonical) {
  if (canonical == "attn_norm.weight") return "ln_1.weight";
  if (canonical == "attn_norm.bias") return "ln_1.bias";
  if (canonical == "o.bias") return "attn.c_proj.bias";
  if (canonical == "mlp_norm.weight") return "ln_2.weight";
  if (canonical == "mlp_norm.bias") return "ln_2.bias";
  if (canonical == "up.bias") return "mlp.c_fc.bias";
  if (canonical == "down.bias") return "mlp.c_proj.bias";
  return nullptr;
}

/// The transposed Conv1D weights other than c_attn: canonical [out, in].
const char* gpt2_block_conv1d(const std::string& canonical) {
  if (canonical == "o.weight") return "attn.c_proj.weight";
  if (canonical == "up.weight") return "mlp.c_fc.weight";
  if (canonical == "down.weight") return "mlp.c_proj.weight";
  return nullptr;
}

void load_gpt2_block(const checkpoint& ck, const model_config& cfg, int layer, param_set& dst) {
  const std::string p = "h." + std::to_string(layer) + ".";
  const std::int64_t D = cfg.hidden_size;
  // c_attn holds q, k and v side by side: read it once for all three.
  const shape_t attn_shape{D, 3 * D}, attn_bias_shape{3 * D};
  const Tensor c_attn = ck.load_f32(gpt2_resolve(ck, p + "attn.c_attn.weight"), &attn_shape);
  const Tensor c_attn_b = ck.load_f32(gpt2_resolve(ck, p + "attn.c_attn.bias"), &attn_bias_shape);
  const char* qkv[] = {"q", "k", "v"};
  for (int part = 0; part < 3; ++part) {
    Tensor w = dst.get(std::string(qkv[part]) + ".weight");
    take_columns_transposed(c_attn.data<float>(), D, 3 * D, part * D, D, w.data<float>());
    copy_floats(c_attn_b, dst.get(std::string(qkv[part]) + ".bias"), part * D);
  }
  for (const auto& e : dst.entries()) {
    if (const char* name = gpt2_block_direct(e.name)) {
      Tensor t = dst.get(e.name);
      ck.load_into(gpt2_resolve(ck, p + name), t);
    } else if (const char* conv = gpt2_block_conv1d(e.name)) {
      const shape_t stored{e.shape[1], e.shape[0]};  // Conv1D is [in, out]
      const Tensor src = ck.load_f32(gpt2_resolve(ck, p + conv), &stored);
      take_columns_transposed(src.data<float>(), stored[0], stored[1], 0, stored[1],
                              dst.get(e.name).data<float>());
    }
  }
}

void load_gpt2_head(const checkpoint& ck, param_set& dst) {
  for (const auto& e : dst.entries()) {
    const char* name = e.name == "embed.weight"        ? "wte.weight"
                       : e.name == "pos_embed.weight"  ? "wpe.weight"
                       : e.name == "final_norm.weight" ? "ln_f.weight"
                       : e.name == "final_norm.bias"   ? "ln_f.bias"
                                                       : nullptr;
    if (!name) throw tensor_error("no HuggingFace GPT-2 name for head tensor '" + e.name + "'");
    Tensor t = dst.get(e.name);
    ck.load_into(gpt2_resolve(ck, name), t);
  }
}

}  // namespace

void load_block_params(const checkpoint& ck, const model_config& cfg, int layer, param_set& dst) {
  if (cfg.arch == architecture::gpt2) {
    load_gpt2_block(ck, cfg, layer, dst);
  } else {
    for (const auto& e : dst.entries()) {
      Tensor t = dst.get(e.name);
      ck.load_into(llama_block_name(cfg, layer, e.name), t);
    }
  }
  if (const block_patch* p = ck.patch()) p->apply(cfg, layer, dst);
}

void load_head_params(const checkpoint& ck, const model_config& cfg, param_set& dst) {
  if (cfg.arch == architecture::gpt2) {
    load_gpt2_head(ck, dst);
    return;
  }
  for (const auto& e : dst.entries()) {
    Tensor t = dst.get(e.name);
    ck.load_into(llama_head_name(e.name), t);
  }
}

std::vector<std::pair<std::string, Tensor>> hf_block_tensors(const model_config& cfg, int layer,
                                                             const param_set& block) {
  std::vector<std::pair<std::string, Tensor>> out;
  if (cfg.arch == architecture::llama) {
    for (const auto& e : block.entries())
      out.emplace_back(llama_block_name(cfg, layer, e.name), block.get(e.name).clone());
    return out;
  }
  // GPT-2, named as GPT2LMHeadModel.save_pretrained names it.
  const std::string p = "transformer.h." + std::to_string(layer) + ".";
  const std::int64_t D = cfg.hidden_size;
  Tensor c_attn = Tensor::empty({D, 3 * D});
  Tensor c_attn_b = Tensor::empty({3 * D});
  const char* qkv[] = {"q", "k", "v"};
  for (int part = 0; part < 3; ++part) {
    put_columns_transposed(block.get(std::string(qkv[part]) + ".weight").data<float>(), D, 3 * D,
                           part * D, D, c_attn.data<float>());
    const Tensor b = block.get(std::string(qkv[part]) + ".bias");
    std::memcpy(c_attn_b.data<float>() + part * D, b.data<float>(),
                static_cast<std::size_t>(D) * sizeof(float));
  }
  for (const auto& e : block.entries()) {
    if (e.name == "q.weight") {
      out.emplace_back(p + "attn.c_attn.weight", c_attn);
      out.emplace_back(p + "attn.c_attn.bias", c_attn_b);
    } else if (const char* name = gpt2_block_direct(e.name)) {
      out.emplace_back(p + name, block.get(e.name).clone());
    } else if (const char* conv = gpt2_block_conv1d(e.name)) {
      Tensor t = Tensor::empty({e.shape[1], e.shape[0]});
      put_columns_transposed(block.get(e.name).data<float>(), e.shape[1], e.shape[0], 0,
                             e.shape[0], t.data<float>());
      out.emplace_back(p + conv, t);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> hf_head_tensors(const model_config& cfg,
                                                            const param_set& head) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& e : head.entries()) {
    std::string name;
    if (cfg.arch == architecture::llama) {
      name = llama_head_name(e.name);
    } else {
      name = e.name == "embed.weight"        ? "transformer.wte.weight"
             : e.name == "pos_embed.weight"  ? "transformer.wpe.weight"
             : e.name == "final_norm.weight" ? "transformer.ln_f.weight"
                                             : "transformer.ln_f.bias";
    }
    out.emplace_back(name, head.get(e.name).clone());
  }
  return out;
}

}  // namespace corolla
