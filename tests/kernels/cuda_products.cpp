// tests/kernels/cuda_products.cpp — the CUDA backend's dense algebra
// against the CPU reference: gemm (every transpose, alpha and beta, leading
// dims, views), f32 products at tf32 and bf16 precision, linear and its
// backward with and without bias, 16-bit storage and bf16 weights.
//
// Every op runs on both backends with the same seeded inputs and the
// outputs are compared element-wise (the tolerances: cuda_ops_util.hpp);
// without the CUDA backend or a visible device each GPU test says why in a
// MESSAGE and returns.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernel_test_util.hpp"
#include "tests/support/gpu.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

// ---- dense algebra -------------------------------------------------------------------

TEST_CASE("cuda: gemm matches the cpu for every transpose combination, alpha and beta") {
  REQUIRE_GPU_OR_SKIP();
  rng r(101);
  for (std::int64_t m : {1, 3, 37}) {
    const std::int64_t k = 19, n = 23;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(m);
        CAPTURE(ta);
        CAPTURE(tb);
        Tensor a = random_tensor(ta ? shape_t{k, m} : shape_t{m, k}, r);
        Tensor b = random_tensor(tb ? shape_t{n, k} : shape_t{k, n}, r);
        Tensor c = random_tensor({m, n}, r);
        Tensor dc = up(c);
        cpu().gemm(a, ta, b, tb, c, 0.7f, 0.3f);
        gpu().gemm(up(a), ta, up(b), tb, dc, 0.7f, 0.3f);
        expect_close(dc, c, red_rtol, red_atol, "gemm");
      }
  }
}

TEST_CASE("cuda: gemm with beta 0 ignores NaN in c, folds leading dims and takes offset views") {
  REQUIRE_GPU_OR_SKIP();
  rng r(102);
  Tensor a = random_tensor({2, 3, 4}, r), b = random_tensor({4, 5}, r);
  Tensor c = filled({6, 5}, std::nanf(""));
  Tensor dc = up(c);
  cpu().gemm(a, false, b, false, c);
  Tensor da = up(a), db = up(b);
  gpu().gemm(da, false, db, false, dc);
  expect_close(dc, c, red_rtol, red_atol, "gemm folded");
  // one row starting 32 bytes into a's storage: not 256-byte aligned
  Tensor c1 = filled({1, 5}, std::nanf(""));
  Tensor dc1 = up(c1);
  cpu().gemm(a.view({6, 4}).slice(2, 3), false, b, false, c1);
  gpu().gemm(da.view({6, 4}).slice(2, 3), false, db, false, dc1);
  expect_close(dc1, c1, red_rtol, red_atol, "gemm row view");
  // k = 0: c = beta * c
  Tensor e0 = Tensor::empty({3, 0}), e1 = Tensor::empty({0, 5});
  Tensor ck = random_tensor({3, 5}, r);
  Tensor dck = up(ck);
  cpu().gemm(e0, false, e1, false, ck, 1.0f, 0.5f);
  gpu().gemm(up(e0), false, up(e1), false, dck, 1.0f, 0.5f);
  expect_close(dck, ck, 0, 0, "gemm k=0");
}

TEST_CASE("cuda: f32 products at tf32 and bf16 precision round their operands and accumulate in f32") {
  REQUIRE_GPU_OR_SKIP();
  rng r(131);
  const std::int64_t M = 37, K = 300, N = 45;
  Tensor a = random_tensor({M, K}, r), b = random_tensor({N, K}, r);
  Tensor exact = Tensor::empty({M, N});
  cpu().gemm(a, false, b, true, exact);
  // How cuBLAS rounds the operands is not specified (nearest or toward
  // zero): each operand moves by at most u relative, a product by 2u + u^2,
  // so |got - exact| <= (2u + u^2) sum_k |a_ik b_jk| (+ f32 summation).
  std::vector<double> mass(static_cast<std::size_t>(M * N), 0.0);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j)
      for (std::int64_t k = 0; k < K; ++k)
        mass[static_cast<std::size_t>(i * N + j)] += std::abs(static_cast<double>(pa[i * K + k]) * pb[j * K + k]);
  Tensor da = up(a), db = up(b), dc = gpu().empty({M, N});
  struct restore {
    ~restore() { set_matmul_precision(matmul_precision::f32); }
  } guard;
  const std::vector<double> want = to_double(exact);
  for (auto [p, u] : {std::pair{matmul_precision::bf16, 1.0 / 128}, std::pair{matmul_precision::tf32, 1.0 / 1024}}) {
    CAPTURE(matmul_precision_name(p));
    set_matmul_precision(p);
    gpu().gemm(da, false, db, true, dc);
    const std::vector<double> got = to_double(down(dc));
    double moved = 0.0;
    int outside = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = std::abs(got[i] - want[i]);
      moved = std::max(moved, err);
      if (err > (2 * u + u * u) * mass[i] + 1e-4) ++outside;
    }
    CHECK(outside == 0);
    CHECK(moved > 1e-5);  // the tensor cores ran: not the f32 result
  }
  set_matmul_precision(matmul_precision::f32);
  gpu().gemm(da, false, db, true, dc);
  expect_close(dc, exact, red_rtol, red_atol, "f32 gemm after the others");
  CHECK(parse_matmul_precision("tf32") == matmul_precision::tf32);
  CHECK_THROWS_WITH_AS(parse_matmul_precision("fp8"), doctest::Contains("expected f32, tf32 or bf16"),
                       std::invalid_argument);
}

TEST_CASE("cuda: linear and linear_backward match the cpu with and without bias") {
  REQUIRE_GPU_OR_SKIP();
  rng r(103);
  const std::int64_t in = 33, out = 17;
  for (std::int64_t rows : {1, 6}) {
    CAPTURE(rows);
    Tensor x = random_tensor({rows, in}, r), w = random_tensor({out, in}, r);
    Tensor bias = random_tensor({out}, r);
    for (bool with_bias : {false, true}) {
      CAPTURE(with_bias);
      Tensor y = Tensor::empty({rows, out});
      Tensor dy_dev = gpu().empty({rows, out});
      Tensor dbias = up(bias);
      cpu().linear(x, w, with_bias ? &bias : nullptr, y);
      gpu().linear(up(x), up(w), with_bias ? &dbias : nullptr, dy_dev);
      expect_close(dy_dev, y, red_rtol, red_atol, "linear y");
    }
    Tensor g = random_tensor({rows, out}, r);
    Tensor dx = Tensor::empty({rows, in});
    Tensor dw = random_tensor({out, in}, r), db = random_tensor({out}, r);
    Tensor ddx = gpu().empty({rows, in}), ddw = up(dw), ddb = up(db);
    cpu().linear_backward(x, w, g, &dx, dw, &db);
    gpu().linear_backward(up(x), up(w), up(g), &ddx, ddw, &ddb);
    expect_close(ddx, dx, red_rtol, red_atol, "linear_backward dx");
    expect_close(ddw, dw, grad_rtol, grad_atol, "linear_backward dw (accumulated)");
    expect_close(ddb, db, grad_rtol, grad_atol, "linear_backward db (accumulated)");
    // without dx and db
    Tensor ddw2 = up(dw);
    cpu().linear_backward(x, w, g, nullptr, dw, nullptr);
    gpu().linear_backward(up(x), up(w), up(g), nullptr, ddw2, nullptr);
    expect_close(ddw2, dw, grad_rtol, grad_atol, "linear_backward dw only");
  }
}

TEST_CASE("cuda: bf16 and f16 gemm and linear accumulate in f32 and write f32 or 16-bit") {
  REQUIRE_GPU_OR_SKIP();
  rng r(104);
  const std::int64_t rows = 9, in = 64, out = 24;
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    const double out16_rtol = t == dtype::bf16 ? 1e-2 : 2e-3;
    Tensor x = random_tensor({rows, in}, r), w = random_tensor({out, in}, r);
    Tensor bias = random_tensor({out}, r);
    Tensor xr = rounded(x, t), wr = rounded(w, t), br = rounded(bias, t);
    Tensor dx16 = up(x, t), dw16 = up(w, t);
    // f32 output
    Tensor y = Tensor::empty({rows, out});
    cpu().linear(xr, wr, &br, y);
    Tensor dbias32 = up(br);  // f32 bias into f32 y: the epilogue path
    Tensor dy32 = gpu().empty({rows, out}, dtype::f32);
    gpu().linear(dx16, dw16, &dbias32, dy32);
    expect_close(dy32, y, red_rtol, red_atol, "16-bit linear -> f32");
    // 16-bit output with a 16-bit bias (epilogue) and an f32 bias (broadcast)
    Tensor dy16 = gpu().empty({rows, out}, t);
    Tensor dbias16 = up(bias, t);
    gpu().linear(dx16, dw16, &dbias16, dy16);
    expect_close(dy16, y, out16_rtol, 1e-2, "16-bit linear -> 16-bit, 16-bit bias");
    gpu().linear(dx16, dw16, &dbias32, dy16);
    expect_close(dy16, y, out16_rtol, 1e-2, "16-bit linear -> 16-bit, f32 bias");
    // gemm with a transpose, f32 output
    Tensor c = Tensor::empty({in, in});
    cpu().gemm(xr, true, xr, false, c);
    Tensor dc = gpu().empty({in, in});
    gpu().gemm(dx16, true, dx16, false, dc);
    expect_close(dc, c, red_rtol, red_atol, "16-bit gemm x^T x -> f32");
    // backward: dx 16-bit, dw f32 (accumulated), db f32
    Tensor g = random_tensor({rows, out}, r);
    Tensor gr = rounded(g, t);
    Tensor dx = Tensor::empty({rows, in}), dw = random_tensor({out, in}, r),
           db = random_tensor({out}, r);
    Tensor ddx = gpu().empty({rows, in}, t), ddw = up(dw), ddb = up(db);
    cpu().linear_backward(xr, wr, gr, &dx, dw, &db);
    gpu().linear_backward(dx16, dw16, up(g, t), &ddx, ddw, &ddb);
    expect_close(ddx, dx, out16_rtol, 1e-2, "16-bit linear_backward dx");
    expect_close(ddw, dw, grad_rtol, grad_atol, "16-bit linear_backward dw (f32)");
    expect_close(ddb, db, grad_rtol, grad_atol, "16-bit linear_backward db (f32)");
  }
}

TEST_CASE("cuda: linear with a bf16 weight and f32 x matches the cpu's bf16-weight linear") {
  REQUIRE_GPU_OR_SKIP();
  rng r(105);
  struct sizes {
    std::int64_t in, out;
  };
  // in % 8 == 0 takes the 16-byte loads, odd widths the scalar loop; rows
  // above 8 take several passes over each weight row
  for (sizes s : {sizes{64, 24}, sizes{37, 29}, sizes{1024, 131}}) {
    Tensor w16 = random_tensor({s.out, s.in}, r).to(dtype::bf16);
    Tensor bias = random_tensor({s.out}, r);
    Tensor dw16 = up(w16), dbias = up(bias);
    for (std::int64_t rows : {1, 3, 8, 9, 40}) {
      for (bool with_bias : {false, true}) {
        CAPTURE(s.in);
        CAPTURE(s.out);
        CAPTURE(rows);
        CAPTURE(with_bias);
        Tensor x = random_tensor({rows, s.in}, r);
        Tensor y = Tensor::empty({rows, s.out});
        cpu().linear(x, w16, with_bias ? &bias : nullptr, y);
        Tensor dy = gpu().empty({rows, s.out});
        gpu().linear(up(x), dw16, with_bias ? &dbias : nullptr, dy);
        expect_close(dy, y, red_rtol, 1e-6 * static_cast<double>(s.in), "bf16-weight linear");
      }
    }
  }
  // a row view (offset start: the scalar loop when not 16-byte aligned)
  Tensor x = random_tensor({5, 64}, r);
  Tensor w16 = random_tensor({24, 64}, r).to(dtype::bf16);
  Tensor y = Tensor::empty({1, 24}), dy = gpu().empty({1, 24});
  cpu().linear(x.slice(3, 4), w16, nullptr, y);
  gpu().linear(up(x).slice(3, 4), up(w16), nullptr, dy);
  expect_close(dy, y, red_rtol, red_atol, "bf16-weight linear on a row view");
}

TEST_CASE("cuda: linear_backward refuses a bf16 weight with f32 activations") {
  REQUIRE_GPU_OR_SKIP();
  rng r(106);
  Tensor x = up(random_tensor({3, 8}, r)), dy = up(random_tensor({3, 4}, r));
  Tensor w16 = up(random_tensor({4, 8}, r), dtype::bf16);
  Tensor dx = gpu().empty({3, 8}), dw = up(Tensor::zeros({4, 8}));
  CHECK_THROWS_WITH_AS(gpu().linear_backward(x, w16, dy, &dx, dw, nullptr),
                       "linear_backward w: bf16 weights are for inference; training keeps f32 "
                       "weights",
                       tensor_error);
}
