// tests/kernels/cuda_epilogues.cpp — training's products with the op after
// them in cuBLASLt's epilogue (kernels/cuda/gemm_epilogues.cpp) against the
// CPU's two ops: linear_fused's residual add for many rows (out of place and
// in place), linear_gelu (GELU_AUX(_BIAS): y and the kept GELU input) and
// gemm_gelu_backward (DGELU), in f32 and bf16, on GPT-2-like proportions;
// and the norms' backward with the residual's gradient added in their dx
// kernel (rmsnorm_backward_add, layernorm_backward_add). Without the CUDA backend or a visible device each test says why in a
// MESSAGE and returns. Tolerances as cuda_ops_util.hpp explains.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

namespace {

/// 64 rows of width 96 into 128 outputs: more than decode's 16 rows, widths
/// that are multiples of 8 (the aux matrix's rule).
constexpr std::int64_t rows = 64, in = 96, out = 128;

/// Tolerance of an output stored in dtype t.
double out_rtol(dtype t) { return t == dtype::f32 ? red_rtol : t == dtype::bf16 ? 1e-2 : 2e-3; }
double out_atol(dtype t) { return t == dtype::f32 ? red_atol : 1e-2; }

}  // namespace

TEST_CASE("cuda: training epilogues (residual add, GELU keeping its input, GELU backward) match the cpu's two ops") {
  REQUIRE_GPU_OR_SKIP();
  rng r(901);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const std::string type_name = dtype_name(t);
    CAPTURE(type_name);
    Tensor x = rounded(random_tensor({rows, in}, r), t), w = rounded(random_tensor({out, in}, r), t);
    Tensor bias = rounded(random_tensor({out}, r), t), res = rounded(random_tensor({rows, out}, r), t);
    Tensor dx = up(x, t), dw = up(w, t), db = up(bias, t);

    // linear + add: y = x w^T + b + residual
    Tensor y = Tensor::empty({rows, out});
    cpu().linear(x, w, &bias, y);
    cpu().add(res, y, y);
    Tensor dres = up(res, t), dy = gpu().empty({rows, out}, t);
    REQUIRE(gpu().linear_fused(dx, dw, &db, linear_epilogue::add, &dres, dy));
    expect_close(dy, y, out_rtol(t), out_atol(t), "linear + add");
    REQUIRE(gpu().linear_fused(dx, dw, &db, linear_epilogue::add, &dres, dres));  // in place
    expect_close(dres, y, out_rtol(t), out_atol(t), "linear + add in place");
    Tensor y_nb = Tensor::empty({rows, out});
    cpu().linear(x, w, nullptr, y_nb);
    cpu().add(res, y_nb, y_nb);
    const Tensor dres2 = up(res, t);
    REQUIRE(gpu().linear_fused(dx, dw, nullptr, linear_epilogue::add, &dres2, dy));
    expect_close(dy, y_nb, out_rtol(t), out_atol(t), "linear + add, no bias");

    // linear + gelu: pre = x w^T + b, y = gelu(pre)
    Tensor pre = Tensor::empty({rows, out}), act = Tensor::empty({rows, out});
    cpu().linear(x, w, &bias, pre);
    cpu().gelu(pre, act);
    Tensor dpre = gpu().empty({rows, out}, t), dact = gpu().empty({rows, out}, t);
    REQUIRE(gpu().linear_gelu(dx, dw, &db, dpre, dact));
    expect_close(dpre, pre, out_rtol(t), out_atol(t), "linear_gelu pre");
    expect_close(dact, act, out_rtol(t), out_atol(t), "linear_gelu y");
    Tensor pre_nb = Tensor::empty({rows, out});
    cpu().linear(x, w, nullptr, pre_nb);
    cpu().gelu(pre_nb, act);
    REQUIRE(gpu().linear_gelu(dx, dw, nullptr, dpre, dact));
    expect_close(dpre, pre_nb, out_rtol(t), out_atol(t), "linear_gelu pre, no bias");
    expect_close(dact, act, out_rtol(t), out_atol(t), "linear_gelu y, no bias");

    // gemm + gelu_backward: dpre = gelu'(pre) * (g @ w2) for y = gelu(pre)
    // feeding a product with w2 [in, out] (pre [rows, out]).
    Tensor w2 = rounded(random_tensor({in, out}, r), t), g = rounded(random_tensor({rows, in}, r), t);
    Tensor pre_r = rounded(pre, t);  // the stored GELU input, as the device keeps it
    Tensor prod = Tensor::empty({rows, out}), want = Tensor::empty({rows, out});
    cpu().gemm(g, false, w2, false, prod);
    cpu().gelu_backward(pre_r, prod, want);
    Tensor dgrad = gpu().empty({rows, out}, t);
    REQUIRE(gpu().gemm_gelu_backward(up(g, t), up(w2, t), up(pre_r, t), dgrad));
    expect_close(dgrad, want, out_rtol(t), t == dtype::f32 ? grad_atol : 1e-2, "gemm_gelu_backward");
  }
}

TEST_CASE("cuda: the training epilogues leave decode's shapes and unaligned widths to the caller") {
  REQUIRE_GPU_OR_SKIP();
  rng r(902);
  Tensor x8 = up(random_tensor({8, in}, r)), w = up(random_tensor({out, in}, r));
  Tensor res8 = up(random_tensor({8, out}, r)), y8 = gpu().empty({8, out});
  CHECK_FALSE(gpu().linear_fused(x8, w, nullptr, linear_epilogue::add, &res8, y8));  // 8 rows: decode's
  Tensor x = up(random_tensor({rows, in}, r)), w12 = up(random_tensor({12, in}, r));
  Tensor pre = gpu().empty({rows, 12}), y = gpu().empty({rows, 12});
  CHECK_FALSE(gpu().linear_gelu(x, w12, nullptr, pre, y));  // 12 outputs: not a multiple of 8
  Tensor mixed = up(random_tensor({rows, in}, r), dtype::bf16), yo = gpu().empty({rows, out}),
         po = gpu().empty({rows, out});
  CHECK_FALSE(gpu().linear_gelu(mixed, w, nullptr, po, yo));  // bf16 x with an f32 weight
}

TEST_CASE("cuda: the norms' backward with the residual's gradient added is the two ops (f32 bit for bit, 16-bit within rounding)") {
  REQUIRE_GPU_OR_SKIP();
  rng r(903);
  const std::int64_t n = 37, d = 96;
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const std::string type_name = dtype_name(t);
    CAPTURE(type_name);
    Tensor x = rounded(random_tensor({n, d}, r), t), dy = rounded(random_tensor({n, d}, r), t),
           dres = rounded(random_tensor({n, d}, r), t);
    Tensor w = random_tensor({d}, r, 0.5f, 1.5f), b = random_tensor({d}, r);
    for (bool layer : {false, true}) {
      CAPTURE(layer);
      // the reference: the cpu's norm backward, then add
      Tensor y = Tensor::empty({n, d}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
      if (layer)
        cpu().layernorm(x, w, b, 1e-5f, y, &mean, &rstd);
      else
        cpu().rmsnorm(x, w, 1e-5f, y, &rstd);
      Tensor want = Tensor::empty({n, d}), dw = Tensor::zeros({d}), db = Tensor::zeros({d});
      if (layer)
        cpu().layernorm_backward(x, w, mean, rstd, dy, want, dw, db);
      else
        cpu().rmsnorm_backward(x, w, rstd, dy, want, dw);
      cpu().add(dres, want, want);
      Tensor dx_dev = up(x, t), ddy = up(dy, t), ddres = up(dres, t), dw_dev = up(w), dmean = up(mean),
             drstd = up(rstd);
      Tensor fused = gpu().empty({n, d}, t), plain = gpu().empty({n, d}, t);
      Tensor gw1 = up(Tensor::zeros({d})), gw2 = up(Tensor::zeros({d})), gb1 = up(Tensor::zeros({d})),
             gb2 = up(Tensor::zeros({d}));
      if (layer) {
        gpu().layernorm_backward_add(dx_dev, dw_dev, dmean, drstd, ddy, ddres, fused, gw1, gb1);
        gpu().layernorm_backward(dx_dev, dw_dev, dmean, drstd, ddy, plain, gw2, gb2);
      } else {
        gpu().rmsnorm_backward_add(dx_dev, dw_dev, drstd, ddy, ddres, fused, gw1);
        gpu().rmsnorm_backward(dx_dev, dw_dev, drstd, ddy, plain, gw2);
      }
      gpu().add(ddres, plain, plain);
      expect_close(fused, want, out_rtol(t), t == dtype::f32 ? grad_atol : 1e-2, "norm backward + add");
      expect_close(gw1, down(gw2), 0, 0, "norm dw");
      if (t == dtype::f32) expect_close(fused, down(plain), 0, 0, "norm backward + add: the two ops' bits");
    }
  }
}
