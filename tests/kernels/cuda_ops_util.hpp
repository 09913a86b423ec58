// tests/kernels/cuda_ops_util.hpp — what the tests of the CUDA backend's
// ops against the CPU reference share (cuda_products.cpp, cuda_ops.cpp,
// cuda_attention.cpp, cuda_devices.cpp): the comparison tolerances and
// small helpers.
//
// Tolerances (|got - want| <= atol + rtol * max(|got|, |want|)):
//  * f32 elementwise ops (device expf/tanhf differ from glibc by a few ulp):
//    rtol 1e-5, atol 1e-6.
//  * f32 reductions (norms, softmax, attention forward, products): rtol 1e-4,
//    atol 1e-5 — summation order differs from the CPU's.
//  * f32 gradients summed over rows (attention backward, dw/db, embedding
//    backward with atomics): rtol 1e-4, atol 1e-4.
//  * bf16/f16 storage: the CPU reference runs on the same rounded inputs in
//    f32; outputs stored in f32 keep the f32 product tolerance (1e-4),
//    outputs stored in bf16 get rtol 1e-2 (8-bit significand), f16 rtol 2e-3.
//  * int8 quantisation and dtype conversions are bit-exact.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/gpu_tensors.hpp"

namespace kernel_test {

inline constexpr double ew_rtol = 1e-5, ew_atol = 1e-6;
inline constexpr double red_rtol = 1e-4, red_atol = 1e-5;
inline constexpr double grad_rtol = 1e-4, grad_atol = 1e-4;

inline corolla::Backend& cpu() { return corolla::cpu_backend(); }

/// f32 host tensor holding `h` rounded to `t` (the reference's inputs for a
/// 16-bit run).
inline Tensor rounded(const Tensor& h, dtype t) { return h.to(t).to(dtype::f32); }

inline void expect_close(const Tensor& device_result, const Tensor& reference, double rtol, double atol,
                         const std::string& what) {
  check_close(to_double(down(device_result)), to_double(reference), rtol, atol, what);
}

inline Tensor ids_tensor(const std::vector<std::int32_t>& v) {
  return Tensor::from_i32(v, {static_cast<std::int64_t>(v.size())});
}

/// The message of what f throws, or "" when it does not throw.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what() && *e.what() ? e.what() : "(empty message)";
  }
  return "";
}

}  // namespace kernel_test
