// model/model_writer.cpp — a HuggingFace model directory written group by
// group (model/model_writer.hpp).
#include "model/model_writer.hpp"

#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/block.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/hf_names.hpp"

namespace corolla {

namespace {

/// `p` with its values on the host (a copy when they are on a device).
param_set on_host(param_set p) {
  if (p.flat().defined() && p.flat().dev().kind != device_kind::cpu) {
    Tensor h = Tensor::empty({p.size()});
    h.copy_from(p.flat());
    p.flat() = std::move(h);
  }
  return p;
}

void write_all(safetensors_writer& file, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  for (const auto& [name, t] : tensors) file.write(name, t);
}

}  // namespace

model_writer::model_writer(const std::filesystem::path& dir, const model_config& cfg) : dir_(dir), cfg_(cfg) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw model_error("cannot create " + dir_.string() + ": " + ec.message());
  // The names and shapes HF gives each group's tensors, from zeroed groups
  // (one block's storage, reused for every layer).
  std::vector<safetensors_writer::entry> entries;
  auto add = [&entries](const std::vector<std::pair<std::string, Tensor>>& tensors) {
    for (const auto& [name, t] : tensors) entries.push_back({name, t.type(), t.shape()});
  };
  add(hf_head_tensors(cfg_, param_set(head_layout(cfg_))));
  const param_set zero_block(block_layout(cfg_));
  for (int i = 0; i < cfg_.n_layers; ++i) add(hf_block_tensors(cfg_, i, zero_block));
  file_ = std::make_unique<safetensors_writer>(dir_ / "model.safetensors", entries,
                                               std::map<std::string, std::string>{{"format", "pt"}});
}

void model_writer::write_head(const param_set& head) { write_all(*file_, hf_head_tensors(cfg_, on_host(head))); }

void model_writer::write_block(int layer, const param_set& block) {
  if (layer < 0 || layer >= cfg_.n_layers)
    throw tensor_error("model_writer: no block " + std::to_string(layer) + " in a model of " +
                       std::to_string(cfg_.n_layers));
  write_all(*file_, hf_block_tensors(cfg_, layer, on_host(block)));
}

void model_writer::commit() {
  file_->commit();
  const std::filesystem::path config = dir_ / "config.json";
  std::ofstream out(config, std::ios::binary | std::ios::trunc);
  if (!out) throw model_error("cannot write " + config.string());
  out << to_hf_json(cfg_).dump(2) << '\n';
  if (!out) throw model_error("cannot write " + config.string());
}

}  // namespace corolla
