// kernels/same_x_batch.hpp — when a backend may run Backend::linear_same_x's
// products (and its backward's weight gradients) as one strided batched
// product: the operands' layout the CUDA backend needs
// (kernels/cuda/gemm_same_x.cpp), which the emulated device checks too
// (tests/emulated_device: that the model lays its q, k and v, and Llama's
// gate and up, out so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "kernels/tensor.hpp"

namespace corolla {

/// The distances in elements from each product's operand to the next's.
struct same_x_strides {
  std::int64_t weights = 0;  ///< forward: the weights; backward: the weight gradients
  std::int64_t outputs = 0;  ///< forward: the outputs; backward: the output gradients
  std::int64_t biases = 0;   ///< forward: the biases (0 without any)
};

/// The distance in elements from each of ts's tensors to the next when
/// there are at least two, all defined and of one shape, dtype and device,
/// each starting that many elements after the one before (positive; at
/// least a tensor's size when `disjoint`, as outputs must be); else nullopt.
std::optional<std::int64_t> even_spacing(std::span<const Tensor* const> ts, bool disjoint);

/// linear_same_x's operands as one batch takes them: x 2-D of a float
/// dtype with rows and width, the weights of x's dtype, evenly spaced,
/// non-empty; the outputs evenly spaced and disjoint, as many; the biases
/// none, or one per weight of the outputs' dtype, evenly spaced. Shapes
/// against x are the caller's to check. Else nullopt (one product each).
std::optional<same_x_strides> linear_same_x_batch(const Tensor& x, std::span<const Tensor* const> ws,
                                                  std::span<const Tensor* const> bs, std::span<Tensor* const> ys);

/// The backward's (the weight gradients as one batch): x as above, output
/// gradients of x's dtype, evenly spaced, one per weight, with a width;
/// weight gradients evenly spaced and disjoint, one per weight; biases'
/// gradients none or one per weight (each its own column sum).
std::optional<same_x_strides> linear_same_x_backward_batch(const Tensor& x, std::span<const Tensor* const> ws,
                                                           std::span<const Tensor* const> dys,
                                                           std::span<Tensor* const> dws,
                                                           std::span<Tensor* const> dbs);

/// Which of the products one batch takes: those from `first` on, with
/// their strides.
struct same_x_batch {
  std::size_t first = 0;
  same_x_strides strides;
};

/// linear_same_x's batch: all its products where they batch; else, with
/// three or more, all but the first (grouped-query attention: q is wider
/// than k and v, which may still batch); else nullopt (one product each).
std::optional<same_x_batch> linear_same_x_plan(const Tensor& x, std::span<const Tensor* const> ws,
                                               std::span<const Tensor* const> bs, std::span<Tensor* const> ys);
/// The backward's, by the same rule.
std::optional<same_x_batch> linear_same_x_backward_plan(const Tensor& x, std::span<const Tensor* const> ws,
                                                        std::span<const Tensor* const> dys,
                                                        std::span<Tensor* const> dws, std::span<Tensor* const> dbs);

}  // namespace corolla
