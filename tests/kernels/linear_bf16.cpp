// tests/kernels/linear_bf16.cpp — CPU linear with a bf16 (inference) weight
// against f32 linear on the same bf16-rounded weight (with the build's AVX2
// and, where the CPU has it, AVX-512), and the ops that refuse a bf16
// weight.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "decode_isa_paths.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("linear with a bf16 weight equals f32 linear on the bf16-rounded weight") {
  Backend& be = cpu_backend();
  rng r(11);
  // [out, in]: odd widths; 4099 inputs make the many-row path widen several
  // blocks of weight rows per thread (about 2^18 / in rows per block). Up to
  // 8 rows take the dot-product path, more the widening GEMM; 32 inputs and
  // more run the dot products' 32 partial sums.
  check_quantised_linear(
      r, {{29, 37}, {67, 129}, {141, 4099}},
      [&](const Tensor& w) {
        const Tensor w16 = w.to(dtype::bf16);
        return quantised_linear{w16.to(dtype::f32),
                                [&be, w16](const Tensor& x, const Tensor* b, Tensor& y) { be.linear(x, w16, b, y); }};
      },
      "bf16-weight linear", {1, 3, 8, 9, 16, 17, 40});
}

TEST_CASE("linear with a bf16 weight takes row views and handles an empty input width") {
  Backend& be = cpu_backend();
  rng r(12);
  Tensor w16 = random_tensor({21, 33}, r).to(dtype::bf16);
  Tensor x = random_tensor({5, 33}, r);
  Tensor row = x.slice(2, 3);
  Tensor got = Tensor::empty({1, 21}), want = Tensor::empty({1, 21});
  be.linear(row, w16, nullptr, got);
  be.linear(row, w16.to(dtype::f32), nullptr, want);
  check_close(got, to_double(want), 1e-5, 1e-5, "row view");

  Tensor x0 = Tensor::empty({3, 0});
  Tensor w0 = Tensor::empty({4, 0}, dtype::bf16);
  Tensor bias = random_tensor({4}, r);
  Tensor y = filled({3, 4}, std::nanf(""));
  be.linear(x0, w0, &bias, y);
  std::vector<double> b = to_double(bias), want0;
  for (int i = 0; i < 3; ++i) want0.insert(want0.end(), b.begin(), b.end());
  check_close(y, want0, 0, 0, "empty input: the bias");
}

TEST_CASE("ops without a bf16-weight form refuse one with a clear error") {
  Backend& be = cpu_backend();
  rng r(13);
  Tensor x = random_tensor({3, 8}, r), dy = random_tensor({3, 4}, r);
  Tensor w16 = random_tensor({4, 8}, r).to(dtype::bf16);
  Tensor dx = Tensor::empty({3, 8}), dw = Tensor::zeros({4, 8});
  CHECK_THROWS_WITH_AS(be.linear_backward(x, w16, dy, &dx, dw, nullptr),
                       "linear_backward w: bf16 weights are for inference; training keeps f32 "
                       "weights",
                       tensor_error);
  // an f16 weight is no inference weight; a bf16 x is not f32 linear
  Tensor y = Tensor::empty({3, 4});
  CHECK_THROWS_WITH_AS(be.linear(x, random_tensor({4, 8}, r).to(dtype::f16), nullptr, y),
                       "linear w: expected an f32 or bf16 weight, got f16", tensor_error);
  CHECK_THROWS_AS(be.linear(x.to(dtype::bf16), w16, nullptr, y), tensor_error);
  // shapes are still checked
  Tensor y_wrong = Tensor::empty({3, 5});
  CHECK_THROWS_AS(be.linear(x, w16, nullptr, y_wrong), tensor_error);
  Tensor bias_f16 = random_tensor({4}, r).to(dtype::bf16);
  CHECK_THROWS_AS(be.linear(x, w16, &bias_f16, y), tensor_error);
}
