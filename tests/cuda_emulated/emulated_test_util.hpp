// tests/cuda_emulated/emulated_test_util.hpp — host-side helpers of the
// emulated kernel tests: raw pointers into host tensors for the kernels'
// arguments, and results widened (or rounded to a 16-bit type and widened)
// for comparison. Plain host C++: include it before cuda_emulation.hpp.
#pragma once

#include <vector>

#include "kernels/tensor.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace emulated_test {

/// `t`'s data as a T* (the device type of its storage: float, __nv_bfloat16, __half).
template <class T>
T* as(const corolla::Tensor& t) {
  return static_cast<T*>(t.raw());
}
inline float* f(const corolla::Tensor& t) { return as<float>(t); }

/// `t`'s values (any float dtype) as doubles.
inline std::vector<double> widened(const corolla::Tensor& t) { return kernel_test::to_double(t.to(corolla::dtype::f32)); }
/// `t` rounded once to `dt`, as doubles: what a kernel storing its f32
/// result as `dt` writes.
inline std::vector<double> rounded_to(const corolla::Tensor& t, corolla::dtype dt) { return widened(t.to(dt)); }

}  // namespace emulated_test
