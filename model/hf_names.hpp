// model/hf_names.hpp — between HuggingFace checkpoint tensors and corolla's
// canonical parameters (listed in model/transformer.hpp).
//
//   Llama (LlamaForCausalLM / MistralForCausalLM), nn.Linear [out, in]:
//     model.embed_tokens.weight, model.norm.weight, lm_head.weight (untied),
//     model.layers.{i}.input_layernorm.weight, .post_attention_layernorm.weight,
//     model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
//     model.layers.{i}.mlp.{gate,up,down}_proj.weight
//   GPT-2 (GPT2LMHeadModel), Conv1D [in, out], optionally under "transformer.":
//     wte.weight, wpe.weight, ln_f.{weight,bias},
//     h.{i}.ln_1.*, h.{i}.ln_2.*, h.{i}.attn.c_attn.{weight [D,3D], bias [3D]}
//     (q, k, v side by side), h.{i}.attn.c_proj.*, h.{i}.mlp.c_fc.*,
//     h.{i}.mlp.c_proj.*; the attn.bias / attn.masked_bias buffers are ignored.
//
// Loading reads only the tensors asked for (one block, or the head), so a
// server hosting some blocks never touches the others' bytes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/config.hpp"
#include "model/params.hpp"
#include "model/safetensors.hpp"

namespace corolla {

/// What changes a block's parameters as they load (a LoRA adapter merged
/// into its base weights, model/lora.hpp): set on a checkpoint
/// (checkpoint::set_patch), applied by load_block_params.
class block_patch {
 public:
  virtual ~block_patch() = default;
  /// Changes `block` (laid out by block_layout(cfg), f32 on the host), the
  /// parameters of block `layer`.
  virtual void apply(const model_config& cfg, int layer, param_set& block) const = 0;
};

/// Fills `dst` (laid out by block_layout(cfg)) with block `layer` of `ck`,
/// converting names, layouts (GPT-2 Conv1D transposes, c_attn split) and
/// dtypes, then applies the checkpoint's patch, if any. Throws model_error
/// naming the tensor and file for a missing tensor or a wrong shape.
void load_block_params(const checkpoint& ck, const model_config& cfg, int layer, param_set& dst);

/// Fills `dst` (laid out by head_layout(cfg)) with the embeddings, final
/// norm and (untied) LM head of `ck`. Errors as load_block_params.
void load_head_params(const checkpoint& ck, const model_config& cfg, param_set& dst);

/// Block `layer`'s tensors under the architecture's HF names and layouts,
/// ready for write_safetensors (new host tensors, f32).
std::vector<std::pair<std::string, Tensor>> hf_block_tensors(const model_config& cfg, int layer,
                                                             const param_set& block);

/// The head's tensors under HF names and layouts (the tied LM head is not
/// written, as HuggingFace does not write it).
std::vector<std::pair<std::string, Tensor>> hf_head_tensors(const model_config& cfg,
                                                            const param_set& head);

}  // namespace corolla
