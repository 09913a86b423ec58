// tests/kernels/linear_q8.cpp — int8 inference weights (quantised per output
// channel with Backend::quantize_int8, one block per row): the round trip
// stays within half a step of every row, and the CPU's linear_q8 equals f32
// linear on the dequantised weight (times the scale) in every path (a few
// rows dotted over the int8 row, many rows widened into sgemm blocks), with
// and without bias; bad operands are refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "decode_isa_paths.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

namespace {

struct q8 {
  Tensor q, scale, dequantised;
};

/// w [out, in] quantised per row, and the f32 values it stands for.
q8 quantise(const Tensor& w) {
  Backend& be = cpu_backend();
  const std::int64_t out = w.dim(0), in = w.dim(1);
  q8 r{Tensor::empty({out, in}, dtype::i8), Tensor::empty({out}), Tensor::empty({out, in})};
  Tensor flat_q = r.q.view({out * in}), flat_d = r.dequantised.view({out * in});
  be.quantize_int8(w.view({out * in}), static_cast<int>(in), flat_q, r.scale);
  be.dequantize_int8(flat_q, r.scale, static_cast<int>(in), flat_d);
  return r;
}

}  // namespace

TEST_CASE("int8 weights quantised per output channel stay within half a step of each row's values") {
  rng r(21);
  Tensor w = random_tensor({13, 70}, r, -2.0f, 2.0f);
  float* wp = w.data<float>();
  for (int i = 0; i < 70; ++i) wp[5 * 70 + i] *= 0.001f;  // a row of small values keeps its own scale
  for (int i = 0; i < 70; ++i) wp[7 * 70 + i] = 0.0f;     // an all-zero row
  const q8 x = quantise(w);
  const std::vector<float> want = w.to_vector(), got = x.dequantised.to_vector(), s = x.scale.to_vector();
  for (std::int64_t o = 0; o < 13; ++o)
    for (std::int64_t i = 0; i < 70; ++i) {
      const auto k = static_cast<std::size_t>(o * 70 + i);
      CHECK(std::abs(got[k] - want[k]) <= s[static_cast<std::size_t>(o)] / 2 * (1 + 1e-6));
    }
  CHECK(s[5] < s[4] / 100);
  CHECK(got[7 * 70 + 3] == 0.0f);
}

TEST_CASE("linear with an int8 weight equals f32 linear on the dequantised weight") {
  Backend& be = cpu_backend();
  rng r(22);
  // [out, in]
  check_quantised_linear(
      r, {{29, 37}, {67, 128}, {141, 4099}},
      [&](const Tensor& w) {
        const q8 x8 = quantise(w);
        return quantised_linear{x8.dequantised, [&be, x8](const Tensor& x, const Tensor* b, Tensor& y) {
                                  be.linear_q8(x, x8.q, x8.scale, b, y);
                                }};
      },
      "int8-weight linear");
  // Operands of the wrong kind are refused.
  const q8 small = quantise(random_tensor({4, 8}, r));
  Tensor x = random_tensor({2, 8}, r), y = Tensor::empty({2, 4});
  CHECK_THROWS_AS(be.linear_q8(x, small.dequantised, small.scale, nullptr, y), tensor_error);  // f32 as q
  CHECK_THROWS_AS(be.linear_q8(x, small.q, Tensor::empty({3}), nullptr, y), tensor_error);    // scale size
  Tensor wrong_y = Tensor::empty({2, 5});
  CHECK_THROWS_AS(be.linear_q8(x, small.q, small.scale, nullptr, wrong_y), tensor_error);
}
