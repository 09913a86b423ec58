// actors/train_save.hpp — the coordinator's side of a distributed job's
// --save: which pieces of which parameter groups it asks which rank for,
// in order (train.paramsask, docs/protocol.md), and each group made whole
// from its pieces. Replica 0 of every stage holds its blocks, rank 0 the
// head; a group larger than dist_train_options::message_piece_bytes is
// asked for in pieces, in order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "model/params.hpp"

namespace corolla {

struct train_layout;
struct dist_train_options;
class model_writer;

/// One ask: values [lo, hi) of bucket `bucket` (of `size` values) from
/// rank `rank`, the ask's number `n` there (a rank answers its asks in
/// order).
struct param_ask {
  int bucket = 0, rank = 0, n = 0;
  std::int64_t lo = 0, hi = 0, size = 0;
  /// "parameters of block.2", with " (values 0..99)" for a piece.
  std::string what() const;
};

/// Every ask of a save, in the order the model file takes them: the head
/// (rank 0), then every block from replica 0 of its stage, each group in
/// pieces of at most `piece_bytes` of values. With `lora` (a LoRA job) the
/// blocks' adapter factors only: the head has none.
std::vector<param_ask> plan_param_asks(const train_layout& l, const model_config& cfg, std::int64_t piece_bytes,
                                       const lora_config* lora = nullptr);

/// The parameter layout of bucket `id` (head_bucket or a block); with
/// `lora`, the adapter's block (lora_block_layout).
std::vector<std::pair<std::string, shape_t>> bucket_layout(const model_config& cfg, int id,
                                                           const lora_config* lora = nullptr);

/// Where a distributed --save's groups go: the model's files, each group
/// as it comes (model_writer: the model is never gathered), or in a LoRA
/// job the adapter's blocks, gathered into one adapter (a few MB) and
/// written in PEFT's layout at the end (lora_adapter::save).
class save_writer {
 public:
  /// Throws model_error when the model's directory or file cannot be made.
  save_writer(const dist_train_options& o, const model_config& cfg);
  ~save_writer();
  /// Group `bucket` (head_bucket or a block) made whole.
  void write(int bucket, const param_set& group);
  /// Every group written: the files take their names. Throws model_error
  /// naming a group not given (the model's), or what the disk refused.
  void commit();

 private:
  std::filesystem::path dir_;
  std::string base_model_;
  std::unique_ptr<model_writer> model_;
  std::unique_ptr<lora_adapter> adapter_;
};

/// Groups made whole from the answers to their asks, taken in order.
class param_group_builder {
 public:
  explicit param_group_builder(const model_config& cfg, std::optional<lora_config> lora = std::nullopt)
      : cfg_(cfg), lora_(std::move(lora)) {}
  /// The answer to `a` from the rank `from` names: the group once its last
  /// piece came (a group of one piece over the answer's own buffer),
  /// nothing before. Throws train_error for an answer that is not
  /// hi - lo f32 values, or one out of order.
  std::optional<param_set> add(const param_ask& a, std::vector<Tensor> tensors, const std::string& from);

 private:
  model_config cfg_;
  std::optional<lora_config> lora_;  ///< a LoRA job's: its groups are adapter blocks
  Tensor group_;               ///< a group of several pieces, as they come
  std::int64_t filled_ = 0;    ///< its values so far
};

}  // namespace corolla
