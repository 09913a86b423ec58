// kernels/cuda/op_args.hpp — the small helpers the CUDA backend's op files
// (cuda_ops.cpp, cuda_attention_ops.cpp) share to hand tensors to the
// launchers (host-only: no CUDA types).
#pragma once

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {

/// The storage type of a float tensor on `where`; throws for other dtypes.
inline elem float_elem(const Tensor& t, device where, const char* what) {
  require_on_device(t, where, what);
  return elem_of(t.type(), what);
}

inline const float* cf(const Tensor& t) { return static_cast<const float*>(t.raw()); }
inline float* f(const Tensor& t) { return static_cast<float*>(t.raw()); }

}  // namespace corolla::cuda
