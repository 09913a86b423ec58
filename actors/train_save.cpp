// actors/train_save.cpp — the asks of a distributed --save and groups made
// whole from their pieces (actors/train_save.hpp).
#include "actors/train_save.hpp"

#include <algorithm>
#include <map>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_store.hpp"
#include "model/block.hpp"
#include "model/head.hpp"
#include "model/model_writer.hpp"

namespace corolla {

std::string param_ask::what() const {
  std::string w = "parameters of " + bucket_name(bucket);
  if (hi - lo < size) w += " (values " + std::to_string(lo) + ".." + std::to_string(hi - 1) + ")";
  return w;
}

std::vector<std::pair<std::string, shape_t>> bucket_layout(const model_config& cfg, int id, const lora_config* lora) {
  if (lora) {
    if (id == head_bucket) throw train_error("a LoRA job's head has no parameters that train");
    return lora_block_layout(cfg, *lora);
  }
  return id == head_bucket ? head_layout(cfg) : block_layout(cfg);
}

std::vector<param_ask> plan_param_asks(const train_layout& l, const model_config& cfg, std::int64_t piece_bytes,
                                       const lora_config* lora) {
  const std::int64_t piece = std::max<std::int64_t>(1, piece_bytes / static_cast<std::int64_t>(sizeof(float)));
  std::vector<param_ask> out;
  std::map<int, int> asked;  // rank -> asks so far
  auto add = [&](int id, int rank) {
    const std::int64_t size = param_set::size_of(bucket_layout(cfg, id, lora));
    for (std::int64_t lo = 0; lo < size; lo += piece)
      out.push_back({id, rank, asked[rank]++, lo, std::min(size, lo + piece), size});
  };
  if (!lora) add(head_bucket, 0);
  for (int v = 0; v < l.virtual_stages(); ++v)
    for (int b = l.boundaries[static_cast<std::size_t>(v)]; b < l.boundaries[static_cast<std::size_t>(v + 1)]; ++b)
      add(b, l.rank_of(v % l.pp, 0));
  return out;
}

save_writer::save_writer(const dist_train_options& o, const model_config& cfg) : dir_(o.save_dir) {
  if (o.lora) {
    adapter_ = std::make_unique<lora_adapter>(lora_adapter::zeros(cfg, o.lora->config));
    base_model_ = o.lora->base_model;
  } else {
    model_ = std::make_unique<model_writer>(o.save_dir, cfg);
  }
}

save_writer::~save_writer() = default;

void save_writer::write(int bucket, const param_set& group) {
  if (adapter_)
    adapter_->block(bucket).flat().copy_from(group.flat());
  else if (bucket == head_bucket)
    model_->write_head(group);
  else
    model_->write_block(bucket, group);
}

void save_writer::commit() {
  if (adapter_)
    adapter_->save(dir_, base_model_);
  else
    model_->commit();
}

std::optional<param_set> param_group_builder::add(const param_ask& a, std::vector<Tensor> tensors,
                                                  const std::string& from) {
  const std::string what = "the " + a.what() + " from " + from;
  if (tensors.size() != 1 || tensors[0].type() != dtype::f32 || tensors[0].shape().size() != 1 ||
      tensors[0].numel() != a.hi - a.lo)
    throw train_error(what + " are not " + std::to_string(a.hi - a.lo) + " f32 values");
  Tensor values = std::move(tensors[0]);
  if (a.hi - a.lo < a.size) {
    if (a.lo == 0) {
      group_ = Tensor::empty({a.size});
      filled_ = 0;
    }
    if (a.lo != filled_ || !group_.defined() || group_.numel() != a.size)
      throw train_error(what + " came out of order");
    group_.slice(a.lo, a.hi).copy_from(values);
    filled_ = a.hi;
    if (a.hi < a.size) return std::nullopt;
    values = std::move(group_);
    group_ = Tensor();
  }
  return param_set(bucket_layout(cfg_, a.bucket, lora_ ? &*lora_ : nullptr), std::move(values));
}

}  // namespace corolla
