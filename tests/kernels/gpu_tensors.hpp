// tests/kernels/gpu_tensors.hpp — moving test tensors to and from cuda:0,
// for the GPU tests (tests/kernels/cuda_*.cpp). The copies go through
// Backend::copy, which converts between dtypes on the device.
#pragma once

#include "kernels/backend.hpp"

namespace kernel_test {

/// The CUDA backend of device 0.
inline corolla::Backend& gpu() { return corolla::backend_for({corolla::device_kind::cuda, 0}); }

/// A device copy of host tensor `h`, stored as `t` (conversion on the device).
inline corolla::Tensor up(const corolla::Tensor& h, corolla::dtype t) {
  corolla::Tensor d = gpu().empty(h.shape(), t);
  gpu().copy(h, d);
  return d;
}
inline corolla::Tensor up(const corolla::Tensor& h) { return up(h, h.type()); }

/// A host copy of device tensor `d` (same dtype).
inline corolla::Tensor down(const corolla::Tensor& d) {
  corolla::Tensor h = corolla::Tensor::empty(d.shape(), d.type());
  gpu().copy(d, h);
  return h;
}

}  // namespace kernel_test
