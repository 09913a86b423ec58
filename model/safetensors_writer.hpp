// model/safetensors_writer.hpp — a .safetensors file written tensor by
// tensor, in any order: the header (every name, dtype and shape) goes first,
// each tensor's bytes go to their offset when that tensor comes, and the
// file takes its name only once every tensor was written (synced, then
// renamed), so a writer that holds one tensor at a time writes a model of
// any size, and a crash or a failure never leaves a partial file under the
// real name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace corolla {

class safetensors_writer {
 public:
  /// A tensor the file will hold.
  struct entry {
    std::string name;
    dtype type = dtype::f32;
    shape_t shape;
  };

  /// Creates `path`'s temporary file (next to it) and writes the header of
  /// `entries`, in their order. Throws tensor_error for a duplicate or
  /// reserved name, model_error when the file cannot be written.
  safetensors_writer(std::filesystem::path path, const std::vector<entry>& entries,
                     const std::map<std::string, std::string>& metadata = {});
  /// Removes the temporary file unless commit() renamed it.
  ~safetensors_writer();
  safetensors_writer(const safetensors_writer&) = delete;
  safetensors_writer& operator=(const safetensors_writer&) = delete;

  /// Writes tensor `name`'s bytes (host, contiguous, the entry's dtype and
  /// shape). Throws tensor_error for an unknown name, a second write, or
  /// another dtype or shape; model_error when the write fails.
  void write(const std::string& name, const Tensor& t);
  /// Syncs the file and renames it to its path. Throws model_error naming
  /// the first tensor not written, or when the sync or rename fails.
  void commit();

 private:
  struct placed {
    dtype type;
    shape_t shape;
    std::uint64_t offset;  ///< in the file
    std::uint64_t bytes;
    bool written = false;
  };

  std::filesystem::path path_, tmp_;
  std::vector<std::string> order_;
  std::map<std::string, placed> placed_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace corolla
