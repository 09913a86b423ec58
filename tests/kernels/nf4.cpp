// tests/kernels/nf4.cpp — NF4 inference weights (kernels/nf4.hpp) on the
// CPU: quantisation gives, bit for bit, the codes of bitsandbytes'
// dQuantizeNF4 (its decision tree written out again here, independently of
// the library's midpoint table) packed in its order; the round trip stays
// within nf4_max_error of each block's absmax and hits the codes exactly;
// linear_nf4 equals f32 linear on the dequantised weight in every path (one
// row fused, a few rows decoded, many rows through sgemm; whole and partial
// blocks, odd rows; with the build's AVX2 and, where the CPU has it,
// AVX-512), with and without bias; bad operands are refused.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "decode_isa_paths.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/nf4.hpp"

using namespace corolla;
using namespace kernel_test;

namespace {

/// bitsandbytes' dQuantizeNF4 (csrc/kernels.cu), as a binary search tree
/// over the normalised value.
int bnb_code(float x) {
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 0b1111 : 0b1110;
      return x > 0.5016634166240692f ? 0b1101 : 0b1100;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 0b1011 : 0b1010;
    return x > 0.1202552504837513f ? 0b1001 : 0b1000;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 0b0111 : 0b0110;
    return x > -0.23460740596055984f ? 0b0101 : 0b0100;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 0b0011 : 0b0010;
  return x > -0.8480964004993439f ? 0b0001 : 0b0000;
}

struct nf4 {
  Tensor q, absmax, dequantised;
};

nf4 quantise(const Tensor& w) {
  Backend& be = cpu_backend();
  const std::int64_t out = w.dim(0), in = w.dim(1);
  const quantized_weight qw = quantize_rows(be, w, weight_format::nf4);
  nf4 r{qw.q, qw.scale, Tensor::empty({out, in})};
  be.dequantize_nf4(r.q, r.absmax, r.dequantised);
  return r;
}

/// The code of value k of row o.
int code_of(const nf4& x, std::int64_t o, std::int64_t k) {
  const auto* q = reinterpret_cast<const std::uint8_t*>(x.q.data<std::int8_t>());
  const std::uint8_t b = q[o * x.q.dim(1) + k / 2];
  return k % 2 == 0 ? b >> 4 : b & 0x0f;
}

}  // namespace

TEST_CASE("nf4 codes are bitsandbytes' codes, packed high nibble first, blocks of 64 per row") {
  rng r(41);
  for (std::int64_t in : {64, 128, 100, 37, 1}) {
    CAPTURE(in);
    Tensor w = random_tensor({5, in}, r, -3.0f, 3.0f);
    float* wp = w.data<float>();
    for (std::int64_t k = 0; k < in; ++k) wp[2 * in + k] = 0.0f;  // an all-zero row
    const nf4 x = quantise(w);
    REQUIRE(x.q.shape() == shape_t{5, (in + 1) / 2});
    REQUIRE(x.absmax.shape() == shape_t{5, (in + 63) / 64});
    const std::vector<float> a = x.absmax.to_vector();
    for (std::int64_t o = 0; o < 5; ++o)
      for (std::int64_t k = 0; k < in; ++k) {
        const float amax = a[static_cast<std::size_t>(o * x.absmax.dim(1) + k / 64)];
        const int want = amax == 0.0f ? 7 : bnb_code(wp[o * in + k] * (1.0f / amax));
        if (code_of(x, o, k) != want) FAIL("row " << o << " value " << k << ": code " << code_of(x, o, k) << ", bitsandbytes " << want);
      }
    for (std::int64_t b = 0; b < x.absmax.dim(1); ++b) CHECK(a[static_cast<std::size_t>(2 * x.absmax.dim(1) + b)] == 0.0f);
    if (in % 2 == 1)  // the pad nibble of an odd row is code 7 (0.0)
      for (std::int64_t o = 0; o < 5; ++o) CHECK(code_of(x, o, in) == 7);
  }
  // The absmax of each block is its own: a block of tiny values keeps its precision.
  Tensor w = random_tensor({1, 128}, r, -1.0f, 1.0f);
  for (int k = 64; k < 128; ++k) w.data<float>()[k] *= 1e-4f;
  const nf4 x = quantise(w);
  CHECK(x.absmax.to_vector()[1] < 1e-4f);
  CHECK(x.absmax.to_vector()[0] > 0.5f);
}

TEST_CASE("nf4 round trip: every value is code * absmax, within nf4_max_error of its block's absmax") {
  for_each_decode_isa([&](const char*) {
    rng r(42);
    for (std::int64_t in : {64, 192, 100, 37}) {
      CAPTURE(in);
      const Tensor w = random_tensor({9, in}, r, -2.0f, 2.0f);
      const nf4 x = quantise(w);
      const std::vector<float> want = w.to_vector(), got = x.dequantised.to_vector(), a = x.absmax.to_vector();
      const std::int64_t blocks = x.absmax.dim(1);
      std::size_t bad = 0;
      for (std::int64_t o = 0; o < 9; ++o)
        for (std::int64_t k = 0; k < in; ++k) {
          const auto i = static_cast<std::size_t>(o * in + k);
          const float amax = a[static_cast<std::size_t>(o * blocks + k / 64)];
          if (got[i] != nf4_codes[code_of(x, o, k)] * amax) ++bad;
          if (std::abs(got[i] - want[i]) > nf4_max_error * amax * (1 + 1e-6f)) ++bad;
        }
      CHECK(bad == 0);
      // The block's largest value comes back exactly (code +-1).
      for (std::int64_t o = 0; o < 9; ++o) {
        float m = 0;
        std::int64_t at = 0;
        for (std::int64_t k = 0; k < std::min<std::int64_t>(in, 64); ++k) {
          const float v = std::abs(want[static_cast<std::size_t>(o * in + k)]);
          if (v > m) {
            m = v;
            at = k;
          }
        }
        CHECK(got[static_cast<std::size_t>(o * in + at)] == want[static_cast<std::size_t>(o * in + at)]);
      }
    }
  });
}

TEST_CASE("linear with an nf4 weight equals f32 linear on the dequantised weight") {
  Backend& be = cpu_backend();
  rng r(43);
  // [out, in]
  check_quantised_linear(
      r, {{29, 64}, {29, 37}, {67, 128}, {16, 100}, {41, 4099}},
      [&](const Tensor& w) {
        const nf4 x4 = quantise(w);
        return quantised_linear{x4.dequantised, [&be, x4](const Tensor& x, const Tensor* b, Tensor& y) {
                                  be.linear_nf4(x, x4.q, x4.absmax, b, y);
                                }};
      },
      "nf4-weight linear");
  // A row slice of a stacked weight is a weight of its own (q, k, v in one stack).
  const Tensor w = random_tensor({12, 128}, r);
  const nf4 all = quantise(w);
  const Tensor x = random_tensor({1, 128}, r);
  Tensor whole = Tensor::empty({1, 12}), part = Tensor::empty({1, 4});
  be.linear_nf4(x, all.q, all.absmax, nullptr, whole);
  be.linear_nf4(x, all.q.slice(4, 8), all.absmax.slice(4, 8), nullptr, part);
  for (int i = 0; i < 4; ++i) CHECK(part.to_vector()[static_cast<std::size_t>(i)] == whole.to_vector()[static_cast<std::size_t>(4 + i)]);

  // Operands of the wrong kind are refused.
  const nf4 small = quantise(random_tensor({4, 8}, r));
  Tensor xs = random_tensor({2, 8}, r), y = Tensor::empty({2, 4});
  CHECK_THROWS_AS(be.linear_nf4(xs, small.dequantised, small.absmax, nullptr, y), tensor_error);     // f32 as q
  CHECK_THROWS_AS(be.linear_nf4(xs, small.q, Tensor::empty({4, 2}), nullptr, y), tensor_error);     // absmax shape
  CHECK_THROWS_AS(be.linear_nf4(random_tensor({2, 10}, r), small.q, small.absmax, nullptr, y), tensor_error);  // in
  Tensor wrong_y = Tensor::empty({2, 5});
  CHECK_THROWS_AS(be.linear_nf4(xs, small.q, small.absmax, nullptr, wrong_y), tensor_error);
  Tensor q_wrong = Tensor::empty({4, 3}, dtype::i8), absmax = Tensor::empty({4, 1});
  CHECK_THROWS_AS(be.quantize_nf4(random_tensor({4, 8}, r), q_wrong, absmax), tensor_error);
  CHECK_THROWS_AS(quantize_rows(be, random_tensor({4, 8}, r), weight_format::bf16), tensor_error);
}
