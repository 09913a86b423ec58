// tests/support/tiny_model.hpp — writes tiny random HuggingFace model
// directories (config.json, safetensors weights with the real HF names and
// layouts, optionally a trained SentencePiece tokenizer.model) and token
// data files, for tests that must not depend on downloads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/config.hpp"

namespace corolla::testing {

/// What write_tiny_model produces. The defaults give a 2-layer GQA Llama
/// small enough for float64 references to run in milliseconds.
struct tiny_model_options {
  architecture arch = architecture::llama;
  int vocab = 64;
  int hidden = 32;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;         ///< ignored for GPT-2 (always == heads)
  int intermediate = 48;
  int max_positions = 64;
  bool tied = false;        ///< llama only; GPT-2 is always tied
  dtype storage = dtype::f32;  ///< f32, bf16 or f16 on disk
  int shards = 1;           ///< > 1: model-0000k-of-0000n.safetensors + index
  std::uint64_t seed = 1;   ///< same seed, same weights (and same tokenizer)
  float init_std = 0.3f;    ///< std of matrices and embeddings
  bool sentencepiece_tokenizer = false;  ///< train and write tokenizer.model
  int bos = -1;             ///< written to config.json when >= 0 (a trained tokenizer overrides)
  int eos = -1;             ///< written to config.json when >= 0 (a trained tokenizer overrides)
  float rope_theta = 10000.0f;  ///< llama only
  /// Llama-family variants (arch llama): "LlamaForCausalLM",
  /// "Qwen2ForCausalLM" (biases on q, k, v), "Qwen3ForCausalLM" (per-head
  /// q/k norms), and the mixtures of experts "MixtralForCausalLM",
  /// "Qwen2MoeForCausalLM" (Qwen2's attention, and a gated shared expert
  /// of width `shared_expert`) and "Qwen3MoeForCausalLM" (Qwen3's
  /// attention), with `experts` experts of width `intermediate` each.
  std::string family = "LlamaForCausalLM";
  int experts = 4;              ///< mixture-of-experts families only
  int experts_per_token = 2;    ///< mixture-of-experts families only
  bool norm_topk_prob = true;   ///< Qwen-MoE only (Mixtral always renormalises)
  int shared_expert = 40;       ///< Qwen2-MoE only: shared_expert_intermediate_size
  bool attention_bias = false;  ///< Llama / Qwen3: biases on q, k, v and o
  int head_dim = 0;             ///< llama family: 0 = hidden / heads
  std::string rope_scaling;     ///< config.json's rope_scaling object as JSON text ("" = none)
  float norm_eps = 1e-5f;
};

/// A fresh, empty, uniquely named directory under the system temp dir
/// (`corolla-<tag>-<pid>-<n>`). The caller removes it (see temp_dir_guard).
std::filesystem::path temp_dir(const std::string& tag);

/// Removes a directory tree when it goes out of scope, also when a test
/// assertion throws.
class temp_dir_guard {
 public:
  /// Creates temp_dir(tag) and owns it.
  explicit temp_dir_guard(const std::string& tag) : path_(temp_dir(tag)) {}
  ~temp_dir_guard();
  temp_dir_guard(const temp_dir_guard&) = delete;
  temp_dir_guard& operator=(const temp_dir_guard&) = delete;
  const std::filesystem::path& path() const { return path_; }
  /// `path() / name`.
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// The default tiny model of `arch`, made GPT-2-shaped for GPT-2 (as many
/// key/value heads as heads, an intermediate size of 4 x hidden), with room
/// for `max_positions` positions.
inline tiny_model_options tiny_options_for(architecture arch, int max_positions = 64) {
  tiny_model_options o;
  o.arch = arch;
  o.max_positions = max_positions;
  if (arch == architecture::gpt2) {
    o.kv_heads = o.heads;
    o.intermediate = 4 * o.hidden;
  }
  return o;
}

/// The model_config that write_tiny_model(dir, o) writes to config.json
/// (before a trained tokenizer sets bos/eos).
model_config tiny_config(const tiny_model_options& o);

/// Writes config.json and the weights (and tokenizer.model when asked) into
/// `dir` (created if needed). Deterministic for the options.
void write_tiny_model(const std::filesystem::path& dir, const tiny_model_options& o);

/// Every tensor of the checkpoint in `dir`, converted to f32, by HF name
/// (for float64 reference implementations).
std::map<std::string, std::vector<float>> read_all_f32(const std::filesystem::path& dir);

/// Writes an llm.c token shard: int32 header[256] (magic 20240520,
/// version 1, token count), then the tokens as uint16.
void write_llmc_shard(const std::filesystem::path& file, const std::vector<std::uint16_t>& tokens);

/// Writes the tokens as a raw little-endian uint16 file (no header).
void write_raw_u16(const std::filesystem::path& file, const std::vector<std::uint16_t>& tokens);

/// Trains a SentencePiece BPE model of exactly `vocab` pieces on a generated
/// English corpus and writes it to `file` (unk 0, bos 1, eos 2). Vocabularies
/// of 128 or more also cover all printable ASCII, digits, punctuation and
/// the characters of "naïve café — 日本語 über straße señor …"; smaller ones
/// cover only lower-case words, spaces, '.' and ','. Line breaks are a
/// piece of their own in both. Throws std::runtime_error
/// if `vocab` cannot be trained on that corpus (33..6000 always work).
void train_sentencepiece(const std::filesystem::path& file, int vocab, std::uint64_t seed = 1);

/// The text of the generated corpus train_sentencepiece uses (one sentence
/// per line); useful as tokenizer and dataset test input.
std::string tiny_corpus(int vocab, std::uint64_t seed = 1);

}  // namespace corolla::testing
