// model/params.hpp — named parameters laid out in one flat f32 buffer.
//
// Every trainable or frozen parameter group (a block, the head) lives in one
// contiguous buffer so that optimisers, gradient reductions and wire transfers
// work on flat ranges (a ZeRO shard is a sub-range), while model code reads
// named views of it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.hpp"

namespace corolla {

class Backend;

/// One parameter's place in a param_set.
struct param_entry {
  std::string name;
  shape_t shape;
  std::int64_t offset = 0;  ///< in elements from the start of the flat buffer
  std::int64_t numel = 0;
};

/// A named set of f32 tensors sharing one zero-initialised flat buffer.
class param_set {
 public:
  param_set() = default;
  /// Lays the tensors out in order, each starting on a 16-element boundary.
  explicit param_set(const std::vector<std::pair<std::string, shape_t>>& layout);
  /// The same layout over `flat` instead of fresh storage (a received
  /// buffer read in place): `flat` must be one-dimensional f32 of exactly
  /// the layout's size; throws tensor_error otherwise.
  param_set(const std::vector<std::pair<std::string, shape_t>>& layout, Tensor flat);
  /// The size() of a set of `layout`, without making one.
  static std::int64_t size_of(const std::vector<std::pair<std::string, shape_t>>& layout);

  /// Same layout, fresh zeroed storage on the same device (for gradients and
  /// optimiser moments).
  param_set like() const;
  /// The flat buffer [size()].
  const Tensor& flat() const { return flat_; }
  Tensor& flat() { return flat_; }
  std::int64_t size() const { return flat_.defined() ? flat_.numel() : 0; }
  /// A view of parameter `name`; throws tensor_error if absent.
  Tensor get(const std::string& name) const;
  bool has(const std::string& name) const;
  const std::vector<param_entry>& entries() const { return entries_; }

 private:
  std::vector<param_entry> entries_;
  Tensor flat_;
};

/// Moves `set`'s storage to `be`'s device (nothing for the CPU backend, or
/// when it is there already): ops take parameters where the backend
/// computes. Views taken of the set before point at the old storage, so
/// whoever holds views resolves them again afterwards.
void place_params(param_set& set, Backend& be);

}  // namespace corolla
