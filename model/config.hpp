// model/config.hpp — model hyper-parameters read from HuggingFace config.json.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/rope_spec.hpp"

namespace corolla {

/// The model families corolla runs.
enum class architecture {
  /// LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
  /// Qwen3ForCausalLM: RMSNorm, RoPE (optionally scaled), SwiGLU, GQA, and
  /// the family's optional q/k/v(/o) biases and per-head q/k norms;
  /// MixtralForCausalLM / Qwen2MoeForCausalLM / Qwen3MoeForCausalLM: the
  /// same attention with a mixture of SwiGLU experts in place of the MLP
  /// (model/moe.hpp)
  llama,
  gpt2,   ///< GPT2LMHeadModel: LayerNorm, learned positions, GELU(tanh), biases, tied head
};

/// Everything the kernels need to know about a model's shape.
struct model_config {
  architecture arch = architecture::llama;
  std::string hf_architecture;  ///< as written in config.json ("LlamaForCausalLM")
  int vocab_size = 0;
  int hidden_size = 0;          ///< D
  int n_layers = 0;
  int n_heads = 0;              ///< Hq
  int n_kv_heads = 0;           ///< Hkv (== Hq without GQA)
  int head_dim = 0;             ///< D / Hq unless config.json says otherwise
  int intermediate_size = 0;    ///< F (MLP width; with experts, each expert's: Qwen3-MoE's moe_intermediate_size)
  int max_positions = 0;        ///< context length (max_position_embeddings / n_positions)
  float norm_eps = 1e-5f;       ///< rms_norm_eps / layer_norm_epsilon
  rope_spec rope;               ///< llama only: rope_theta and rope_scaling
  std::string rope_scaling;     ///< config.json's rope_scaling object as written ("" for plain RoPE)
  bool qkv_bias = false;        ///< q, k, v projections have biases (Qwen2; Llama's attention_bias)
  bool o_bias = false;          ///< the output projection has a bias (Llama's attention_bias)
  bool qk_norm = false;         ///< per-head RMSNorm of q and k before RoPE (Qwen3's q_norm, k_norm)
  bool tie_embeddings = false;  ///< LM head shares the token embedding table
  /// Mixture of experts (Mixtral's num_local_experts, Qwen3-MoE's
  /// num_experts): every block's MLP is this many SwiGLU experts of width F
  /// and a router; 0 = a dense MLP.
  int n_experts = 0;
  int experts_per_token = 0;    ///< top-k experts per token (num_experts_per_tok)
  /// The top-k routing probabilities are renormalised to sum to 1 (Mixtral
  /// always; Qwen3-MoE's norm_topk_prob).
  bool norm_topk_prob = false;
  /// Qwen2-MoE's shared expert (shared_expert_intermediate_size): one more
  /// SwiGLU MLP of this width that every token goes through, its output
  /// scaled by sigmoid(shared_expert_gate(x)) and added to the experts'
  /// mixture; 0 = none.
  int shared_expert_size = 0;
  int bos_token_id = -1;        ///< -1 when unknown
  int eos_token_id = -1;        ///< -1 when unknown
  /// Every end-of-sequence id (Llama 3.1 instruct ends turns with
  /// <|eot_id|> and <|eom_id|> as well as <|end_of_text|>): config.json's
  /// list, then generation_config.json's; eos_token_id is the first.
  std::vector<int> eos_token_ids;

  bool is_moe() const { return n_experts > 0; }
  bool has_shared_expert() const { return shared_expert_size > 0; }
  /// Throws model_error if the numbers are inconsistent (e.g. Hq % Hkv != 0).
  void validate() const;
  /// Parameters in the whole model (including embeddings).
  long long parameter_count() const;
};

/// Parses config.json text. Throws model_error (naming `origin`) for an
/// unknown architecture or a missing/invalid field.
model_config parse_config(const nlohmann::json& j, const std::string& origin = "config.json");
/// Reads `dir/config.json` (or the file itself if `path` is a file), and
/// the end-of-sequence ids of generation_config.json beside it.
model_config load_config(const std::filesystem::path& path);
/// The config.json a HuggingFace loader would accept for this model.
nlohmann::json to_hf_json(const model_config& c);

}  // namespace corolla
