// tests/kernels/tensor_half.cpp — Tensor views, slices and errors; bf16 and
// f16 conversions (round to nearest even, subnormals, inf, NaN, overflow).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/half.hpp"
#include "kernels/tensor.hpp"

using namespace corolla;

TEST_CASE("tensor views share storage and infer one dimension") {
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[i] = float(i);
  Tensor t = Tensor::from_f32(values, {3, 4});
  Tensor v = t.view({2, -1});
  CHECK(v.shape() == shape_t{2, 6});
  CHECK(v.raw() == t.raw());
  v.data<float>()[7] = 70.0f;
  CHECK(t.data<float>()[7] == 70.0f);
  CHECK_THROWS_AS(t.view({5, -1}), tensor_error);
  CHECK_THROWS_AS(t.view({-1, -1}), tensor_error);
  CHECK_THROWS_AS(t.view({3, 5}), tensor_error);
  CHECK(t.dim(-1) == 4);
  CHECK_THROWS_AS(t.dim(2), tensor_error);
}

TEST_CASE("tensor slices are windows along the first dimension") {
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[i] = float(i);
  Tensor t = Tensor::from_f32(values, {4, 3});
  Tensor s = t.slice(1, 3);
  CHECK(s.shape() == shape_t{2, 3});
  CHECK(s.numel() == 6);
  CHECK(s.to_vector() == std::vector<float>{3, 4, 5, 6, 7, 8});
  s.data<float>()[0] = -1.0f;  // writes through to the parent
  CHECK(t.data<float>()[3] == -1.0f);
  Tensor ss = s.slice(1, 2).view({3});
  CHECK(ss.to_vector() == std::vector<float>{6, 7, 8});
  CHECK(t.slice(4, 4).numel() == 0);
  CHECK_THROWS_AS(t.slice(2, 5), tensor_error);
  CHECK_THROWS_AS(t.slice(3, 2), tensor_error);
  CHECK_THROWS_AS(t.slice(-1, 2), tensor_error);
  Tensor c = s.clone();  // a deep copy
  c.data<float>()[1] = 99.0f;
  CHECK(t.data<float>()[4] == 4.0f);
  // slice_into: the same window, into a kept tensor (whose shape storage it reuses).
  Tensor into = Tensor::zeros({7, 7});
  const auto* shape_storage = into.shape().data();
  t.slice_into(2, 4, into);
  CHECK(into.shape() == shape_t{2, 3});
  CHECK(into.numel() == 6);
  CHECK(into.to_vector() == std::vector<float>{6, 7, 8, 9, 10, 11});
  CHECK(into.shape().data() == shape_storage);
  t.slice_into(0, 0, into);
  CHECK(into.numel() == 0);
  CHECK_THROWS_AS(t.slice_into(3, 5, into), tensor_error);
}

TEST_CASE("tensor typed access, construction and conversion errors are tensor_error") {
  Tensor f = Tensor::zeros({2, 2});
  CHECK_THROWS_AS(f.data<std::int32_t>(), tensor_error);
  CHECK_THROWS_AS(f.data<std::uint16_t>(), tensor_error);
  const std::vector<float> three{1, 2, 3};
  CHECK_THROWS_AS(Tensor::from_f32(three, {2, 2}), tensor_error);
  CHECK_THROWS_AS(Tensor::wrap(storage::allocate(8), 4, {2}, dtype::f32), tensor_error);
  CHECK_THROWS_AS(Tensor::empty({2, -3}), tensor_error);
  CHECK_THROWS_AS(f.to(dtype::i32), tensor_error);
  CHECK_THROWS_AS(f.to(dtype::i8), tensor_error);
  CHECK_THROWS_AS(f.copy_from(Tensor::zeros({3})), tensor_error);
  CHECK_THROWS_WITH_AS(expect_shape(f, {2, 3}, "w"), "w: expected shape [2, 3], got [2, 2]",
                       tensor_error);
  CHECK_THROWS_WITH_AS(expect_dtype(f, dtype::bf16, "w"), "w: expected bf16, got f32",
                       tensor_error);
  Tensor undefined;
  CHECK_FALSE(undefined.defined());
  CHECK_FALSE(undefined.clone().defined());
}

TEST_CASE("tensor conversions cover integer sources and 16-bit floats") {
  const std::vector<std::int32_t> ints{-3, 0, 7};
  Tensor i = Tensor::from_i32(ints, {3});
  CHECK(i.to_vector() == std::vector<float>{-3, 0, 7});
  CHECK(i.to(dtype::bf16).to_vector() == std::vector<float>{-3, 0, 7});
  Tensor q = Tensor::empty({2}, dtype::i8);
  q.data<std::int8_t>()[0] = -127;
  q.data<std::int8_t>()[1] = 5;
  CHECK(q.to_vector() == std::vector<float>{-127, 5});
  const std::vector<float> values{1.5f, -0.25f, 1024.0f};
  Tensor f = Tensor::from_f32(values, {3});
  CHECK(f.to(dtype::f16).to(dtype::bf16).to_vector() == values);
  CHECK(f.to(dtype::bf16).nbytes() == 6);
}

namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
constexpr float inf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even at every halfway point") {
  // Every pair of adjacent finite positive bf16 values: the midpoint goes to
  // the even one, a hair either side goes to the nearer one.
  for (std::uint32_t h = 0; h < 0x7f7f; ++h) {
    const float lo = bf16_to_f32(static_cast<std::uint16_t>(h));
    const float hi = bf16_to_f32(static_cast<std::uint16_t>(h + 1));
    const float mid = from_bits((bits(lo) + bits(hi)) / 2);  // same exponent or carry: exact
    const std::uint16_t even = static_cast<std::uint16_t>(h % 2 == 0 ? h : h + 1);
    if (f32_to_bf16(mid) != even) FAIL_CHECK("bf16 tie at " << h);
    if (f32_to_bf16(std::nextafter(mid, 0.0f)) != h) FAIL_CHECK("bf16 below tie at " << h);
    if (f32_to_bf16(std::nextafter(mid, inf)) != h + 1) FAIL_CHECK("bf16 above tie at " << h);
    if (f32_to_bf16(-lo) != (h | 0x8000u)) FAIL_CHECK("bf16 sign at " << h);
  }
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(f32_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001)))));  // payload only in low bits
  CHECK(bf16_to_f32(f32_to_bf16(from_bits(0x00010000))) == from_bits(0x00010000));  // subnormal
}

TEST_CASE("f16 conversion rounds to nearest even and handles subnormals, inf, NaN, overflow") {
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {
    const float lo = f16_to_f32(static_cast<std::uint16_t>(h));
    const float hi = f16_to_f32(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((double(lo) + double(hi)) / 2);  // exact in f32
    const std::uint16_t even = static_cast<std::uint16_t>(h % 2 == 0 ? h : h + 1);
    if (f32_to_f16(mid) != even) FAIL_CHECK("f16 tie at " << h);
    if (f32_to_f16(std::nextafter(mid, 0.0f)) != h) FAIL_CHECK("f16 below tie at " << h);
    if (f32_to_f16(std::nextafter(mid, inf)) != h + 1) FAIL_CHECK("f16 above tie at " << h);
    if (f32_to_f16(lo) != h) FAIL_CHECK("f16 round trip at " << h);
    if (f32_to_f16(-lo) != (h | 0x8000u)) FAIL_CHECK("f16 sign at " << h);
  }
  CHECK(f32_to_f16(1.0f) == 0x3c00);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // tie with zero: even
  CHECK(f32_to_f16(std::ldexp(1.0f, -26)) == 0x0000);
  CHECK(f32_to_f16(-std::ldexp(1.0f, -30)) == 0x8000);  // underflow keeps the sign
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
  CHECK(f32_to_f16(65519.99f) == 0x7bff);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);  // rounds past the largest half: inf
  CHECK(f32_to_f16(1e10f) == 0x7c00);
  CHECK(f32_to_f16(-1e10f) == 0xfc00);
  CHECK(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(f16_to_f32(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  CHECK(std::isnan(f16_to_f32(0x7e00)));
  CHECK(f32_to_f16(-0.0f) == 0x8000);

  std::vector<float> src{1.0f, 0.5f, -65504.0f, std::ldexp(1.0f, -24)};
  std::vector<std::uint16_t> mid(4);
  std::vector<float> back(4);
  f32_to_f16(src.data(), mid.data(), 4);
  f16_to_f32(mid.data(), back.data(), 4);
  CHECK(back == src);
  f32_to_bf16(src.data(), mid.data(), 4);
  bf16_to_f32(mid.data(), back.data(), 4);
  CHECK(back[0] == 1.0f);
  CHECK(back[2] == -65536.0f);  // 65504 needs more than bf16's 8 bits: rounds to 2^16
}
