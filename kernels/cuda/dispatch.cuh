// kernels/cuda/dispatch.cuh — maps an elem code to its device type for
// launchers (nvcc only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Calls f(T{}) with T = float, __nv_bfloat16 or __half for `e`.
template <class F>
void dispatch_elem(elem e, F&& f) {
  switch (e) {
    case elem::f32: f(float{}); return;
    case elem::bf16: f(__nv_bfloat16{}); return;
    case elem::f16: f(__half{}); return;
  }
  throw std::logic_error("dispatch_elem: unknown element type");
}

}  // namespace corolla::cuda
