// model/safetensors.hpp — the safetensors file format: memory-mapped reading,
// and writing (for saving checkpoints and for tests that build tiny models).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.hpp"

namespace corolla {

class block_patch;

/// One tensor's entry in a safetensors header.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  shape_t shape;
  std::uint64_t begin = 0;  ///< byte offset into the data section
  std::uint64_t end = 0;
};

/// A memory-mapped .safetensors file. The header is fully validated on open
/// (JSON, dtypes, offsets inside the file, sizes equal to shape x dtype);
/// tensors are views into the mapping (no copy, nothing read until touched).
class safetensors_file : public std::enable_shared_from_this<safetensors_file> {
 public:
  /// Throws model_error naming the file for a missing, truncated or
  /// malformed file.
  static std::shared_ptr<safetensors_file> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find(const std::string& name) const;
  /// The header's "__metadata__" (string values only; empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A view of the tensor in its stored dtype, borrowing the mapping.
  Tensor view(const std::string& name) const;
  ~safetensors_file();

 private:
  safetensors_file() = default;
  std::filesystem::path path_;
  std::map<std::string, tensor_info> tensors_;
  std::map<std::string, std::string> metadata_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::size_t data_offset_ = 0;
};

/// The header's name of `t` ("F32", "BF16", ...).
const char* safetensors_dtype_name(dtype t);

/// Writes `tensors` (any host dtype, in the given order) to `path`, through
/// a temporary file synced and renamed (model/safetensors_writer.hpp).
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// All tensors of a HuggingFace checkpoint directory: `model.safetensors`, or
/// `model.safetensors.index.json` with its shards. Opening reads headers only.
class checkpoint {
 public:
  /// Throws model_error for a missing directory, no weights file, a broken
  /// index or shard.
  static checkpoint open(const std::filesystem::path& dir);

  bool has(const std::string& name) const;
  /// Header entry; throws model_error "tensor NAME missing from DIR".
  const tensor_info& info(const std::string& name) const;
  /// The tensor converted to f32 on the host; throws model_error if it is
  /// missing or its shape differs from `expected` (when given).
  Tensor load_f32(const std::string& name, const shape_t* expected = nullptr) const;
  /// Loads into preallocated f32 `dst` (shape must match exactly).
  void load_into(const std::string& name, Tensor& dst) const;
  std::vector<std::string> names() const;
  const std::filesystem::path& dir() const { return dir_; }
  /// What load_block_params applies to each block it reads from here (a
  /// LoRA adapter merged into the weights: model/lora.hpp); null: nothing.
  void set_patch(std::shared_ptr<const block_patch> p) { patch_ = std::move(p); }
  const block_patch* patch() const { return patch_.get(); }

 private:
  std::filesystem::path dir_;
  std::shared_ptr<const block_patch> patch_;
  std::map<std::string, std::shared_ptr<safetensors_file>> by_name_;
};

}  // namespace corolla
