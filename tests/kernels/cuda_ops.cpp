// tests/kernels/cuda_ops.cpp — the CUDA backend against the CPU reference.
//
// Every op runs on both backends with the same seeded inputs (copied to the
// device with Backend::copy) and the outputs, backward outputs included, are
// compared element-wise. Without the CUDA backend or a visible device each
// GPU test says why in a MESSAGE and returns; the tests at the end (device
// errors, the memory hooks) run everywhere.
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
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "tests/support/gpu.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/allocator.hpp"
#include "kernels/cuda/device.hpp"
#endif

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

namespace {

constexpr double ew_rtol = 1e-5, ew_atol = 1e-6;
constexpr double red_rtol = 1e-4, red_atol = 1e-5;
constexpr double grad_rtol = 1e-4, grad_atol = 1e-4;

Backend& cpu() { return cpu_backend(); }

/// f32 host tensor holding `h` rounded to `t` (the reference's inputs for a
/// 16-bit run).
Tensor rounded(const Tensor& h, dtype t) { return h.to(t).to(dtype::f32); }

void expect_close(const Tensor& device_result, const Tensor& reference, double rtol, double atol,
                  const std::string& what) {
  check_close(to_double(down(device_result)), to_double(reference), rtol, atol, what);
}

Tensor ids_tensor(const std::vector<std::int32_t>& v) {
  return Tensor::from_i32(v, {static_cast<std::int64_t>(v.size())});
}

/// The message of what f throws, or "" when it does not throw.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what() && *e.what() ? e.what() : "(empty message)";
  }
  return "";
}

}  // namespace

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

// ---- embeddings ----------------------------------------------------------------------

TEST_CASE("cuda: embedding and its backward match the cpu with ids on the host or the device") {
  REQUIRE_GPU_OR_SKIP();
  rng r(105);
  const std::int64_t vocab = 11, d = 20;
  const std::vector<std::int32_t> idv{3, 0, 10, 3, 3, 7};
  Tensor ids = ids_tensor(idv);
  Tensor table = random_tensor({vocab, d}, r);
  Tensor out = Tensor::empty({6, d});
  cpu().embedding(ids, table, out);
  Tensor dtable_dev = up(table);
  for (bool ids_on_device : {false, true}) {
    CAPTURE(ids_on_device);
    Tensor the_ids = ids_on_device ? up(ids) : ids;
    Tensor dout = gpu().empty({6, d});
    gpu().embedding(the_ids, dtable_dev, dout);
    expect_close(dout, out, 0, 0, "embedding");
  }
  Tensor g = random_tensor({6, d}, r);
  Tensor acc = random_tensor({vocab, d}, r);
  Tensor dacc = up(acc);
  cpu().embedding_backward(ids, g, acc);
  gpu().embedding_backward(up(ids), up(g), dacc);
  expect_close(dacc, acc, grad_rtol, grad_atol, "embedding_backward");
  // bf16 table
  Tensor out16 = gpu().empty({6, d}, dtype::bf16);
  gpu().embedding(ids, up(table, dtype::bf16), out16);
  expect_close(out16, rounded(out, dtype::bf16), 0, 0, "bf16 embedding");
  // an id outside the table
  const std::vector<std::int32_t> bad{1, 11};
  Tensor dout = gpu().empty({2, d});
  CHECK_THROWS_WITH_AS(gpu().embedding(ids_tensor(bad), dtable_dev, dout),
                       doctest::Contains("id 11"), tensor_error);
  CHECK_THROWS_WITH_AS(gpu().embedding(up(ids_tensor(bad)), dtable_dev, dout),
                       doctest::Contains("id 11"), tensor_error);
}

// ---- normalisation -------------------------------------------------------------------

TEST_CASE("cuda: rmsnorm and layernorm forward and backward match the cpu") {
  REQUIRE_GPU_OR_SKIP();
  rng r(106);
  for (std::int64_t d : {7, 300, 1100}) {
    CAPTURE(d);
    const std::int64_t n = 5;
    Tensor x = random_tensor({n, d}, r, -2.0f, 3.0f), w = random_tensor({d}, r),
           b = random_tensor({d}, r);
    Tensor dx_in = up(x), dw_in = up(w), db_in = up(b);
    Tensor y = Tensor::empty({n, d}), rstd = Tensor::empty({n}), mean = Tensor::empty({n});
    Tensor dyv = gpu().empty({n, d}), drstd = gpu().empty({n}), dmean = gpu().empty({n});

    cpu().rmsnorm(x, w, 1e-5f, y, &rstd);
    gpu().rmsnorm(dx_in, dw_in, 1e-5f, dyv, &drstd);
    expect_close(dyv, y, red_rtol, red_atol, "rmsnorm y");
    expect_close(drstd, rstd, red_rtol, red_atol, "rmsnorm rstd");
    Tensor g = random_tensor({n, d}, r);
    Tensor dx = Tensor::empty({n, d}), dw = random_tensor({d}, r);
    Tensor ddx = gpu().empty({n, d}), ddw = up(dw);
    cpu().rmsnorm_backward(x, w, rstd, g, dx, dw);
    gpu().rmsnorm_backward(dx_in, dw_in, up(rstd), up(g), ddx, ddw);
    expect_close(ddx, dx, red_rtol, red_atol, "rmsnorm dx");
    expect_close(ddw, dw, grad_rtol, grad_atol, "rmsnorm dw (accumulated)");

    cpu().layernorm(x, w, b, 1e-5f, y, &mean, &rstd);
    gpu().layernorm(dx_in, dw_in, db_in, 1e-5f, dyv, &dmean, &drstd);
    expect_close(dyv, y, red_rtol, red_atol, "layernorm y");
    expect_close(dmean, mean, red_rtol, red_atol, "layernorm mean");
    expect_close(drstd, rstd, red_rtol, red_atol, "layernorm rstd");
    Tensor dbias = random_tensor({d}, r);
    Tensor ddw2 = up(dw), ddb = up(dbias);
    cpu().layernorm_backward(x, w, mean, rstd, g, dx, dw, dbias);
    gpu().layernorm_backward(dx_in, dw_in, up(mean), up(rstd), up(g), ddx, ddw2, ddb);
    expect_close(ddx, dx, red_rtol, red_atol, "layernorm dx");
    expect_close(ddw2, dw, grad_rtol, grad_atol, "layernorm dw (accumulated)");
    expect_close(ddb, dbias, grad_rtol, grad_atol, "layernorm db (accumulated)");
  }
}

// ---- rope ------------------------------------------------------------------------------

TEST_CASE("cuda: rope and its inverse match the cpu, positions on the host or the device") {
  REQUIRE_GPU_OR_SKIP();
  rng r(107);
  const int heads = 3, head_dim = 16;
  const std::vector<std::int32_t> posv{0, 1, 5, 4095, 70000};
  Tensor pos = ids_tensor(posv);
  Tensor x = random_tensor({5, heads * head_dim}, r);
  for (bool inverse : {false, true})
    for (bool pos_on_device : {false, true}) {
      CAPTURE(inverse);
      CAPTURE(pos_on_device);
      Tensor want = x.clone();
      cpu().rope(want, pos, heads, head_dim, 10000.0f, inverse);
      Tensor got = up(x);
      gpu().rope(got, pos_on_device ? up(pos) : pos, heads, head_dim, 10000.0f, inverse);
      expect_close(got, want, ew_rtol, ew_atol, "rope");
    }
  const std::vector<std::int32_t> neg{0, -1, 2, 3, 4};
  Tensor dx = up(x);
  CHECK_THROWS_WITH_AS(gpu().rope(dx, ids_tensor(neg), heads, head_dim, 10000.0f),
                       doctest::Contains("-1"), tensor_error);
}

// ---- attention -----------------------------------------------------------------------

TEST_CASE("cuda: the fused decode ops (add_rmsnorm, rope_store_kv) equal the cpu's separate ops") {
  REQUIRE_GPU_OR_SKIP();
  rng r(133);
  for (std::int64_t n : {1, 3}) {
    CAPTURE(n);
    const std::int64_t d = 4096 + 8;
    Tensor a = random_tensor({n, d}, r), b = random_tensor({n, d}, r), w = random_tensor({d}, r);
    Tensor sum = Tensor::empty({n, d}), y = Tensor::empty({n, d});
    cpu().add_rmsnorm(a, b, sum, w, 1e-5f, y);
    Tensor dsum = gpu().empty({n, d}), dy = gpu().empty({n, d});
    gpu().add_rmsnorm(up(a), up(b), dsum, up(w), 1e-5f, dy);
    expect_close(dsum, sum, 0.0, 0.0, "add_rmsnorm sum");
    expect_close(dy, y, red_rtol, red_atol, "add_rmsnorm y");

    const int hq = 8, hkv = 2, dh = 64;
    Tensor q = random_tensor({n, hq * dh}, r), k = random_tensor({n, hkv * dh}, r), v = random_tensor({n, hkv * dh}, r);
    std::vector<std::int32_t> pos;
    for (std::int64_t i = 0; i < n; ++i) pos.push_back(static_cast<std::int32_t>(17 + 5 * i));
    const Tensor positions = ids_tensor(pos);
    for (bool rotate : {true, false}) {
      CAPTURE(rotate);
      Tensor cq = q.clone(), ck_in = k.clone(), ck = Tensor::empty({n, hkv * dh}), cv = Tensor::empty({n, hkv * dh});
      cpu().rope_store_kv(cq, ck_in, v, positions, hq, hkv, dh, 10000.0f, rotate, ck.data<float>(), cv.data<float>(),
                          dtype::f32);
      Tensor gq = up(q), gk = up(k), gk_out = gpu().empty({n, hkv * dh}), gv_out = gpu().empty({n, hkv * dh});
      gpu().rope_store_kv(gq, gk, up(v), positions, hq, hkv, dh, 10000.0f, rotate, gk_out.raw(), gv_out.raw(),
                          dtype::f32);
      expect_close(gq, cq, ew_rtol, ew_atol, "rope_store_kv q");
      expect_close(gk_out, ck, ew_rtol, ew_atol, "rope_store_kv k_out");
      expect_close(gv_out, cv, 0.0, 0.0, "rope_store_kv v_out");
      expect_close(gk, k, 0.0, 0.0, "rope_store_kv leaves k");
    }
  }
}

TEST_CASE("cuda: attention forward and backward match the cpu (MHA, GQA, head sizes)") {
  REQUIRE_GPU_OR_SKIP();
  rng r(108);
  struct config {
    int hq, hkv, dh, batch, seq;
    float scale;
  };
  // Head sizes up to 128 take the tiled kernels (tiles of 32 rows: sequences
  // of one, several and partial tiles), 256 the warp-per-row ones.
  for (const config& c : {config{2, 2, 16, 2, 13, 0.0f}, config{4, 2, 80, 1, 9, 0.0f},
                          config{6, 2, 64, 2, 70, 0.3f}, config{2, 1, 256, 1, 5, 0.0f},
                          config{4, 4, 128, 2, 100, 0.0f}, config{8, 2, 32, 1, 64, 0.0f},
                          config{2, 2, 100, 1, 45, 0.0f}, config{2, 1, 256, 1, 40, 0.0f}}) {
    CAPTURE(c.hq);
    CAPTURE(c.hkv);
    CAPTURE(c.dh);
    CAPTURE(c.seq);
    const attention_shape s{c.hq, c.hkv, c.dh, c.scale};
    const std::int64_t rows = std::int64_t{c.batch} * c.seq;
    const std::int64_t qw = std::int64_t{c.hq} * c.dh, kw = std::int64_t{c.hkv} * c.dh;
    Tensor q = random_tensor({rows, qw}, r), k = random_tensor({rows, kw}, r),
           v = random_tensor({rows, kw}, r);
    Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({std::int64_t{c.batch} * c.hq * c.seq});
    cpu().attention(q, k, v, c.batch, c.seq, s, out, &lse);
    Tensor dq_in = up(q), dk_in = up(k), dv_in = up(v);
    Tensor dout = gpu().empty(out.shape()), dlse = gpu().empty(lse.shape());
    gpu().attention(dq_in, dk_in, dv_in, c.batch, c.seq, s, dout, &dlse);
    expect_close(dout, out, red_rtol, red_atol, "attention out");
    expect_close(dlse, lse, red_rtol, red_atol, "attention lse");

    Tensor g = random_tensor({rows, qw}, r);
    Tensor gq = Tensor::empty({rows, qw}), gk = Tensor::empty({rows, kw}),
           gv = Tensor::empty({rows, kw});
    cpu().attention_backward(q, k, v, out, lse, g, c.batch, c.seq, s, gq, gk, gv);
    Tensor dgq = gpu().empty(gq.shape()), dgk = gpu().empty(gk.shape()),
           dgv = gpu().empty(gv.shape());
    gpu().attention_backward(dq_in, dk_in, dv_in, up(out), up(lse), up(g), c.batch, c.seq, s, dgq,
                             dgk, dgv);
    expect_close(dgq, gq, grad_rtol, grad_atol, "attention dq");
    expect_close(dgk, gk, grad_rtol, grad_atol, "attention dk");
    expect_close(dgv, gv, grad_rtol, grad_atol, "attention dv");
  }
  const attention_shape too_wide{1, 1, 512, 0.0f};
  Tensor q = gpu().empty({2, 512}), o = gpu().empty({2, 512});
  CHECK_THROWS_WITH_AS(gpu().attention(q, q, q, 1, 2, too_wide, o, nullptr),
                       doctest::Contains("not implemented on CUDA"), tensor_error);
}

TEST_CASE("cuda: cached attention over device pages equals full attention (decode and chunks)") {
  REQUIRE_GPU_OR_SKIP();
  rng r(109);
  struct geometry {
    int hq, hkv, dh;
    std::int64_t T, page_tokens;
  };
  // Contexts past 64 keys take several key chunks (merged by a second kernel).
  for (const geometry& gm : {geometry{4, 2, 32, 23, 5}, geometry{4, 2, 32, 200, 5},
                             geometry{8, 2, 128, 150, 16}, geometry{2, 1, 80, 70, 7}}) {
    CAPTURE(gm.T);
    CAPTURE(gm.dh);
    const attention_shape s{gm.hq, gm.hkv, gm.dh, 0.0f};
    const std::int64_t T = gm.T, qw = gm.hq * gm.dh, kw = gm.hkv * gm.dh, page_tokens = gm.page_tokens;
    Tensor q = random_tensor({T, qw}, r), k = random_tensor({T, kw}, r), v = random_tensor({T, kw}, r);
    Tensor full = Tensor::empty({T, qw});
    cpu().attention(q, k, v, 1, static_cast<int>(T), s, full, nullptr);
    // Device pages holding the same rows (the last page partly filled).
    const std::int64_t pages = (T + page_tokens - 1) / page_tokens;
    std::vector<Tensor> kp, vp;
    std::vector<const void*> kptr, vptr;
    for (std::int64_t p = 0; p < pages; ++p) {
      kp.push_back(gpu().empty({page_tokens, kw}));
      vp.push_back(gpu().empty({page_tokens, kw}));
      const std::int64_t end = std::min(T, (p + 1) * page_tokens);
      Tensor kd = kp.back().slice(0, end - p * page_tokens), vd = vp.back().slice(0, end - p * page_tokens);
      gpu().copy(k.slice(p * page_tokens, end), kd);
      gpu().copy(v.slice(p * page_tokens, end), vd);
      kptr.push_back(kp.back().data<float>());
      vptr.push_back(vp.back().data<float>());
    }
    kv_pages_view view;
    view.k_pages = kptr;
    view.v_pages = vptr;
    view.page_tokens = page_tokens;
    view.length = T;
    struct chunk {
      std::int64_t start, tq;
    };
    std::vector<chunk> chunks{{0, 1}, {7, 1}, {T - 1, 1}, {0, T}, {9, std::min<std::int64_t>(T - 9, 70)}};
    if (T > 66) chunks.insert(chunks.end(), {{63, 1}, {64, 1}, {65, 1}, {T - 30, 30}});
    for (const chunk& c : chunks) {
      CAPTURE(c.start);
      CAPTURE(c.tq);
      Tensor dq = up(q.slice(c.start, c.start + c.tq));
      Tensor dout = gpu().empty({c.tq, qw});
      gpu().attention_cached(dq, view, c.start, s, dout);
      expect_close(dout, full.slice(c.start, c.start + c.tq), red_rtol, red_atol,
                   "attention_cached vs attention");
    }
    // The same pages as a bf16 cache against the cpu's bf16 cache (both
    // widen the stored values and compute in f32).
    std::vector<Tensor> kp16, vp16, kh16, vh16;
    std::vector<const void*> k16, v16, kh, vh;
    for (std::int64_t p = 0; p < pages; ++p) {
      kh16.push_back(Tensor::empty({page_tokens, kw}));
      vh16.push_back(Tensor::empty({page_tokens, kw}));
      gpu().copy(kp[static_cast<std::size_t>(p)], kh16.back());
      gpu().copy(vp[static_cast<std::size_t>(p)], vh16.back());
      kh16.back() = kh16.back().to(dtype::bf16);
      vh16.back() = vh16.back().to(dtype::bf16);
      kp16.push_back(up(kh16.back()));
      vp16.push_back(up(vh16.back()));
      k16.push_back(kp16.back().raw());
      v16.push_back(vp16.back().raw());
      kh.push_back(kh16.back().raw());
      vh.push_back(vh16.back().raw());
    }
    const kv_pages_view view16{k16, v16, page_tokens, T, dtype::bf16}, host16{kh, vh, page_tokens, T, dtype::bf16};
    for (const chunk& c : chunks) {
      CAPTURE(c.start);
      CAPTURE(c.tq);
      const Tensor qs = q.slice(c.start, c.start + c.tq);
      Tensor dout = gpu().empty({c.tq, qw}), want = Tensor::empty({c.tq, qw});
      gpu().attention_cached(up(qs), view16, c.start, s, dout);
      cpu().attention_cached(qs, host16, c.start, s, want);
      expect_close(dout, want, red_rtol, red_atol, "attention_cached on a bf16 cache");
    }
  }
  const attention_shape s{4, 2, 32, 0.0f};
  const std::int64_t T = 23, qw = 4 * 32, kw = 2 * 32;
  Tensor q = random_tensor({T, qw}, r), k = random_tensor({T, kw}, r);
  Tensor v = random_tensor({T, kw}, r);
  // A host-resident cache is refused by name.
  std::vector<const void*> host_k{k.data<float>()}, host_v{v.data<float>()};
  kv_pages_view host_view;
  host_view.k_pages = host_k;
  host_view.v_pages = host_v;
  host_view.page_tokens = T;
  host_view.length = T;
  Tensor dq = up(q.slice(0, 1)), dout = gpu().empty({1, qw});
  CHECK_THROWS_WITH_AS(gpu().attention_cached(dq, host_view, 0, s, dout),
                       doctest::Contains("not memory of cuda:0"), tensor_error);
}

// ---- activations and elementwise -----------------------------------------------------

TEST_CASE("cuda: swiglu, gelu, add, scale and sum_squares match the cpu in f32") {
  REQUIRE_GPU_OR_SKIP();
  rng r(110);
  const shape_t sh{37, 129};
  Tensor a = random_tensor(sh, r, -4.0f, 4.0f), b = random_tensor(sh, r), g = random_tensor(sh, r);
  Tensor da = up(a), db = up(b), dg = up(g);
  Tensor o = Tensor::empty(sh), o2 = Tensor::empty(sh);
  Tensor dout = gpu().empty(sh), dout2 = gpu().empty(sh);

  cpu().swiglu(a, b, o);
  gpu().swiglu(da, db, dout);
  expect_close(dout, o, ew_rtol, ew_atol, "swiglu");
  cpu().swiglu_backward(a, b, g, o, o2);
  gpu().swiglu_backward(da, db, dg, dout, dout2);
  expect_close(dout, o, ew_rtol, ew_atol, "swiglu dgate");
  expect_close(dout2, o2, ew_rtol, ew_atol, "swiglu dup");
  cpu().gelu(a, o);
  gpu().gelu(da, dout);
  expect_close(dout, o, ew_rtol, ew_atol, "gelu");
  cpu().gelu_backward(a, g, o);
  gpu().gelu_backward(da, dg, dout);
  expect_close(dout, o, ew_rtol, ew_atol, "gelu dx");
  cpu().add(a, b, o);
  Tensor da2 = up(a);
  gpu().add(da2, db, da2);  // out aliases a
  expect_close(da2, o, 0, 0, "add (aliased)");
  gpu().scale(da2, -0.37f);
  cpu().scale(o, -0.37f);
  expect_close(da2, o, 0, 0, "scale");
  const double want = cpu().sum_squares(a), got = gpu().sum_squares(da);
  CHECK(std::fabs(got - want) <= 1e-9 * want);
  Tensor big = random_tensor({300001}, r);
  const double want_big = cpu().sum_squares(big), got_big = gpu().sum_squares(up(big));
  CHECK(std::fabs(got_big - want_big) <= 1e-9 * want_big);
  CHECK(gpu().sum_squares(gpu().empty({0})) == 0.0);
}

TEST_CASE("cuda: elementwise ops in bf16 and f16 compute in f32 and round once") {
  REQUIRE_GPU_OR_SKIP();
  rng r(111);
  const shape_t sh{1000};
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    const double rt = t == dtype::bf16 ? 1e-2 : 2e-3;
    Tensor a = rounded(random_tensor(sh, r, -3.0f, 3.0f), t), b = rounded(random_tensor(sh, r), t);
    Tensor da = up(a, t), db = up(b, t);
    Tensor o = Tensor::empty(sh), o2 = Tensor::empty(sh);
    Tensor dout = gpu().empty(sh, t), dout2 = gpu().empty(sh, t);
    cpu().swiglu(a, b, o);
    gpu().swiglu(da, db, dout);
    expect_close(dout, o, rt, 1e-3, "swiglu 16-bit");
    cpu().swiglu_backward(a, b, b, o, o2);
    gpu().swiglu_backward(da, db, db, dout, dout2);
    expect_close(dout, o, rt, 1e-3, "swiglu dgate 16-bit");
    expect_close(dout2, o2, rt, 1e-3, "swiglu dup 16-bit");
    cpu().gelu(a, o);
    gpu().gelu(da, dout);
    expect_close(dout, o, rt, 1e-3, "gelu 16-bit");
    cpu().gelu_backward(a, b, o);
    gpu().gelu_backward(da, db, dout);
    expect_close(dout, o, rt, 1e-3, "gelu dx 16-bit");
    cpu().add(a, b, o);
    gpu().add(da, db, dout);
    expect_close(dout, o, rt, 1e-3, "add 16-bit");
    gpu().scale(dout, 0.5f);
    cpu().scale(o, 0.5f);
    expect_close(dout, o, rt, 1e-3, "scale 16-bit");
    const double want = cpu().sum_squares(a), got = gpu().sum_squares(da);
    CHECK(std::fabs(got - want) <= 1e-9 * want);  // inputs are exact in both
  }
}

TEST_CASE("cuda: norms, rope and cross_entropy in bf16 and f16 storage compute in f32 and round once") {
  REQUIRE_GPU_OR_SKIP();
  rng r(119);
  const std::int64_t n = 5, d = 96;
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    const double rt = t == dtype::bf16 ? 1e-2 : 2e-3;
    const Tensor x = rounded(random_tensor({n, d}, r), t), b2 = rounded(random_tensor({n, d}, r), t),
                 dy = rounded(random_tensor({n, d}, r), t);
    const Tensor w = random_tensor({d}, r, 0.5f, 1.5f), bias = random_tensor({d}, r);
    const Tensor dx16 = up(x, t), db216 = up(b2, t), ddy16 = up(dy, t), dw = up(w), dbias = up(bias);
    Tensor y = Tensor::empty({n, d}), rstd = Tensor::empty({n}), mean = Tensor::empty({n});
    Tensor gy = gpu().empty({n, d}, t), grstd = gpu().empty({n}), gmean = gpu().empty({n});
    cpu().rmsnorm(x, w, 1e-5f, y, &rstd);
    gpu().rmsnorm(dx16, dw, 1e-5f, gy, &grstd);
    expect_close(gy, y, rt, 1e-3, "rmsnorm 16-bit y");
    expect_close(grstd, rstd, red_rtol, red_atol, "rmsnorm 16-bit rstd");
    Tensor gdx = gpu().empty({n, d}, t), dx = Tensor::empty({n, d});
    Tensor gw = up(kernel_test::filled({d}, 0.0f)), hw = kernel_test::filled({d}, 0.0f);
    cpu().rmsnorm_backward(x, w, rstd, dy, dx, hw);
    gpu().rmsnorm_backward(dx16, dw, grstd, ddy16, gdx, gw);
    expect_close(gdx, dx, rt, 1e-3, "rmsnorm 16-bit dx");
    expect_close(gw, hw, grad_rtol, grad_atol, "rmsnorm 16-bit dw");
    cpu().layernorm(x, w, bias, 1e-5f, y, &mean, &rstd);
    gpu().layernorm(dx16, dw, dbias, 1e-5f, gy, &gmean, &grstd);
    expect_close(gy, y, rt, 1e-3, "layernorm 16-bit y");
    Tensor gb = up(kernel_test::filled({d}, 0.0f)), hb = kernel_test::filled({d}, 0.0f);
    gw = up(kernel_test::filled({d}, 0.0f));
    hw = kernel_test::filled({d}, 0.0f);
    cpu().layernorm_backward(x, w, mean, rstd, dy, dx, hw, hb);
    gpu().layernorm_backward(dx16, dw, gmean, grstd, ddy16, gdx, gw, gb);
    expect_close(gdx, dx, rt, 1e-3, "layernorm 16-bit dx");
    expect_close(gw, hw, grad_rtol, grad_atol, "layernorm 16-bit dw");
    expect_close(gb, hb, grad_rtol, grad_atol, "layernorm 16-bit db");
    // add + rmsnorm in 16-bit storage equals add, then rmsnorm.
    Tensor gsum = gpu().empty({n, d}, t), gsum2 = gpu().empty({n, d}, t), gy2 = gpu().empty({n, d}, t);
    gpu().add_rmsnorm(dx16, db216, gsum, dw, 1e-5f, gy);
    gpu().add(dx16, db216, gsum2);
    gpu().rmsnorm(gsum2, dw, 1e-5f, gy2, nullptr);
    CHECK(same_values(down(gsum), down(gsum2)));
    CHECK(same_values(down(gy), down(gy2)));

    const std::vector<std::int32_t> pos = {0, 1, 17, 300, 4095};
    Tensor q = rounded(random_tensor({n, 2 * 48}, r), t), gq = up(q, t);
    cpu().rope(q, ids_tensor(pos), 2, 48, 10000.0f);
    gpu().rope(gq, ids_tensor(pos), 2, 48, 10000.0f);
    expect_close(gq, q, rt, 1e-3, "rope 16-bit");

    const std::int64_t vocab = 500;
    Tensor logits = rounded(random_tensor({n, vocab}, r, -4.0f, 4.0f), t), glogits = up(logits, t);
    const Tensor targets = ids_tensor({3, -1, 0, 499, 7});
    Tensor losses = Tensor::empty({n}), glosses = gpu().empty({n}), dl = Tensor::empty({n, vocab});
    cpu().cross_entropy(logits, targets, losses, &dl, 0.2f);
    gpu().cross_entropy(glogits, targets, glosses, &glogits, 0.2f);
    expect_close(glosses, losses, red_rtol, red_atol, "cross_entropy 16-bit losses");
    expect_close(glogits, dl, rt, 1e-4, "cross_entropy 16-bit dlogits");
  }
}

TEST_CASE("cuda: attention and its backward in bf16 and f16 storage on the f32-arithmetic kernels round once") {
  REQUIRE_GPU_OR_SKIP();
  rng r(121);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    // Head sizes the tensor-core kernels do not take (16-bit tensors go to
    // them at 32, 64, 96 and 128: tests/kernels/cuda_attention_mma.cpp):
    // 48 runs the tiled kernels, 160 the warp-per-row ones past 128.
    for (const int dh : {48, 160}) {
      CAPTURE(dtype_name(t));
      CAPTURE(dh);
      const double rt = t == dtype::bf16 ? 1e-2 : 2e-3;
      const int B = 2, T = 37, hq = 4, hkv = 2;
      const std::int64_t rows = B * T, qw = std::int64_t{hq} * dh, kw = std::int64_t{hkv} * dh;
      const Tensor q = rounded(random_tensor({rows, qw}, r), t), k = rounded(random_tensor({rows, kw}, r), t),
                   v = rounded(random_tensor({rows, kw}, r), t), g = rounded(random_tensor({rows, qw}, r), t);
      attention_shape s;
      s.n_heads = hq;
      s.n_kv_heads = hkv;
      s.head_dim = dh;
      Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({B * hq * T});
      cpu().attention(q, k, v, B, T, s, out, &lse);
      Tensor dq = Tensor::empty({rows, qw}), dk = Tensor::empty({rows, kw}), dv = Tensor::empty({rows, kw});
      // The reference backward runs from the device's (rounded) output, as the device's does.
      const Tensor gq = up(q, t), gk = up(k, t), gv = up(v, t), gg = up(g, t);
      Tensor gout = gpu().empty({rows, qw}, t), glse = gpu().empty({B * hq * T});
      gpu().attention(gq, gk, gv, B, T, s, gout, &glse);
      expect_close(gout, out, rt, 1e-3, "attention 16-bit out");
      expect_close(glse, lse, red_rtol, red_atol, "attention 16-bit lse");
      Tensor out_dev = Tensor::empty({rows, qw});
      gpu().copy(gout, out_dev);
      cpu().attention_backward(q, k, v, out_dev, lse, g, B, T, s, dq, dk, dv);
      Tensor gdq = gpu().empty({rows, qw}, t), gdk = gpu().empty({rows, kw}, t), gdv = gpu().empty({rows, kw}, t);
      gpu().attention_backward(gq, gk, gv, gout, glse, gg, B, T, s, gdq, gdk, gdv);
      expect_close(gdq, dq, rt, 1e-2, "attention 16-bit dq");
      expect_close(gdk, dk, rt, 1e-2, "attention 16-bit dk");
      expect_close(gdv, dv, rt, 1e-2, "attention 16-bit dv");
    }
  }
}

// ---- loss and optimiser ----------------------------------------------------------------

TEST_CASE("cuda: cross_entropy matches the cpu, ignores -1 rows and may write into logits") {
  REQUIRE_GPU_OR_SKIP();
  rng r(112);
  const std::int64_t n = 6, vocab = 1000;
  Tensor logits = random_tensor({n, vocab}, r, -5.0f, 5.0f);
  const std::vector<std::int32_t> tv{3, -1, 999, 0, 500, -1};
  Tensor targets = ids_tensor(tv);
  Tensor losses = Tensor::empty({n}), dl = Tensor::empty({n, vocab});
  cpu().cross_entropy(logits, targets, losses, &dl, 0.25f);
  for (bool targets_on_device : {false, true}) {
    CAPTURE(targets_on_device);
    Tensor dlogits = up(logits), dlosses = gpu().empty({n}), dgrad = gpu().empty({n, vocab});
    Tensor t = targets_on_device ? up(targets) : targets;
    gpu().cross_entropy(dlogits, t, dlosses, &dgrad, 0.25f);
    expect_close(dlosses, losses, red_rtol, red_atol, "cross_entropy losses");
    expect_close(dgrad, dl, red_rtol, 1e-7, "cross_entropy dlogits");
    gpu().cross_entropy(dlogits, t, dlosses, &dlogits, 0.25f);  // in place
    expect_close(dlosses, losses, red_rtol, red_atol, "cross_entropy losses (in place)");
    expect_close(dlogits, dl, red_rtol, 1e-7, "cross_entropy dlogits (in place)");
    gpu().cross_entropy(up(logits), t, dlosses, nullptr, 1.0f);
    expect_close(dlosses, losses, red_rtol, red_atol, "cross_entropy without gradient");
  }
  const std::vector<std::int32_t> bad{3, 1000, 0, 0, 0, 0};
  Tensor dlosses = gpu().empty({n});
  CHECK_THROWS_WITH_AS(gpu().cross_entropy(up(logits), ids_tensor(bad), dlosses, nullptr, 1.0f),
                       doctest::Contains("1000"), tensor_error);
}

TEST_CASE("cuda: adamw steps match the cpu") {
  REQUIRE_GPU_OR_SKIP();
  rng r(113);
  const std::int64_t n = 5003;
  Tensor p = random_tensor({n}, r), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  Tensor dp = up(p), dm = up(m), dv = up(v);
  adamw_params hp{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (std::int64_t step = 1; step <= 3; ++step) {
    hp.grad_scale = step == 3 ? 0.25f : 1.0f;  // unscaling and clipping folded in
    Tensor g = random_tensor({n}, r);
    cpu().adamw(p, g, m, v, hp, step);
    gpu().adamw(dp, up(g), dm, dv, hp, step);
  }
  expect_close(dp, p, ew_rtol, ew_atol, "adamw params");
  expect_close(dm, m, ew_rtol, ew_atol, "adamw m");
  expect_close(dv, v, ew_rtol, ew_atol, "adamw v");
}

// ---- wire compression ------------------------------------------------------------------

TEST_CASE("cuda: int8 quantisation is bit-exact with the cpu, short last block included") {
  REQUIRE_GPU_OR_SKIP();
  rng r(114);
  const std::int64_t n = 1000;
  const int block = 64;
  Tensor x = random_tensor({n}, r, -3.0f, 3.0f);
  float* xp = x.data<float>();
  for (int i = 64; i < 128; ++i) xp[i] = 0.0f;  // an all-zero block
  const std::int64_t blocks = (n + block - 1) / block;
  Tensor q = Tensor::empty({n}, dtype::i8), sc = Tensor::empty({blocks});
  cpu().quantize_int8(x, block, q, sc);
  Tensor dq = gpu().empty({n}, dtype::i8), dsc = gpu().empty({blocks});
  gpu().quantize_int8(up(x), block, dq, dsc);
  CHECK(same_values(down(dq), q));
  CHECK(same_values(down(dsc), sc));
  Tensor back = Tensor::empty({n}), dback = gpu().empty({n});
  cpu().dequantize_int8(q, sc, block, back);
  gpu().dequantize_int8(dq, dsc, block, dback);
  CHECK(same_values(down(dback), back));
}

// ---- transfers, tensors, memory, errors ------------------------------------------------

TEST_CASE("cuda: copy converts on the device exactly like the host conversion") {
  REQUIRE_GPU_OR_SKIP();
  rng r(115);
  Tensor x = random_tensor({777}, r, -1e4f, 1e4f);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    Tensor d16 = up(x, t);  // H2D with conversion
    CHECK(same_values(down(d16), x.to(t)));
    Tensor h32 = Tensor::empty({777});
    gpu().copy(d16, h32);  // D2H with conversion
    CHECK(same_values(h32, x.to(t).to(dtype::f32)));
    Tensor d32 = gpu().empty({777});
    gpu().copy(d16, d32);  // D2D with conversion
    CHECK(same_values(down(d32), h32));
  }
  const std::vector<std::int32_t> iv{1, -2, 3};
  Tensor di = up(ids_tensor(iv));
  CHECK(same_values(down(di), ids_tensor(iv)));
  Tensor df = gpu().empty({3});
  CHECK_THROWS_AS(gpu().copy(di, df), tensor_error);  // i32 -> f32 is not a copy
}

TEST_CASE("cuda: device tensors zero, clone, copy_from and to_vector through the hooks") {
  REQUIRE_GPU_OR_SKIP();
  rng r(116);
  Tensor h = random_tensor({4, 9}, r);
  Tensor d = up(h);
  CHECK(d.dev() == device{device_kind::cuda, 0});
  Tensor c = d.clone();
  CHECK(c.dev() == d.dev());
  CHECK(c.raw() != d.raw());
  CHECK(c.to_vector() == h.to_vector());
  Tensor e = Tensor::empty({4, 9}, dtype::f32, {device_kind::cuda, 0});
  e.copy_from(h);  // H2D
  CHECK(e.to_vector() == h.to_vector());
  Tensor back = Tensor::empty({4, 9});
  back.copy_from(e);  // D2H
  CHECK(same_values(back, h));
  e.slice(1, 3).zero();
  std::vector<float> want = h.to_vector();
  for (int i = 9; i < 27; ++i) want[i] = 0.0f;
  CHECK(e.to_vector() == want);
  CHECK_THROWS_AS(e.to(dtype::bf16), tensor_error);  // host-only conversion
  CHECK(gpu().name() == "cuda:0");
  CHECK(&gpu() == &backend_for({device_kind::cuda, 0}));
}

TEST_CASE("cuda: an impossible allocation says out of memory and the allocator keeps working") {
  REQUIRE_GPU_OR_SKIP();
  const std::string msg =
      error_of([] { Tensor::empty({std::int64_t{1} << 42}, dtype::f32, {device_kind::cuda, 0}); });
  CHECK_MESSAGE(msg.find("out of memory") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("cuda:0") != std::string::npos, msg);
  Tensor ok = gpu().empty({1024});
  ok.zero();
  CHECK(gpu().sum_squares(ok) == 0.0);
#ifdef COROLLA_HAVE_CUDA
  // A released block is reused for the next request of its size class.
  const auto before = cuda::stats(0);
  { Tensor t = gpu().empty({12345}); }
  { Tensor t = gpu().empty({12345}); }
  CHECK(cuda::stats(0).device_mallocs <= before.device_mallocs + 1);
#endif
}

TEST_CASE("cuda: ops reject wrong shapes, dtypes and host tensors with tensor_error") {
  REQUIRE_GPU_OR_SKIP();
  rng r(117);
  Tensor x = up(random_tensor({3, 8}, r)), w = up(random_tensor({4, 8}, r));
  Tensor y_wrong = gpu().empty({3, 5});
  CHECK_THROWS_AS(gpu().linear(x, w, nullptr, y_wrong), tensor_error);
  Tensor c = gpu().empty({3, 3});
  CHECK_THROWS_WITH_AS(gpu().gemm(x, false, w, false, c), doctest::Contains("gemm"),
                       tensor_error);
  Tensor host_x = random_tensor({3, 8}, r);
  Tensor y = gpu().empty({3, 4});
  CHECK_THROWS_WITH_AS(gpu().linear(host_x, w, nullptr, y), doctest::Contains("cuda:0"),
                       tensor_error);
  // f32 x takes an f32 or a bf16 (inference) weight, nothing else
  Tensor w16 = up(random_tensor({4, 8}, r), dtype::f16);
  CHECK_THROWS_WITH_AS(gpu().linear(x, w16, nullptr, y), doctest::Contains("f32 or bf16 weight"),
                       tensor_error);
  Tensor rn = gpu().empty({3, 8});
  CHECK_THROWS_AS(gpu().rmsnorm(x, up(random_tensor({7}, r)), 1e-5f, rn, nullptr), tensor_error);
  // 16-bit activations keep one dtype; the weight stays f32
  Tensor rn16 = gpu().empty({3, 8}, dtype::bf16);
  CHECK_THROWS_WITH_AS(gpu().rmsnorm(x, up(random_tensor({8}, r)), 1e-5f, rn16, nullptr),
                       doctest::Contains("rmsnorm y"), tensor_error);
  CHECK_THROWS_WITH_AS(gpu().rmsnorm(up(random_tensor({3, 8}, r), dtype::bf16), up(random_tensor({8}, r), dtype::bf16),
                                     1e-5f, rn16, nullptr),
                       doctest::Contains("rmsnorm w"), tensor_error);
  CHECK_THROWS_AS(gpu().add(x, gpu().empty({8, 3}), rn), tensor_error);
  Tensor xi = gpu().empty({3, 8}, dtype::i32);
  CHECK_THROWS_AS(gpu().gelu(xi, xi), tensor_error);
  // the CPU backend refuses device tensors
  Tensor hy = Tensor::empty({3, 8});
  CHECK_THROWS_WITH_AS(cpu().gelu(x, hy), doctest::Contains("cuda:0"), tensor_error);
}

// ---- without a GPU -------------------------------------------------------------------------

TEST_CASE("device names parse, auto is cuda:0 with a visible GPU and the cpu without") {
  CHECK(parse_device("cpu").kind == device_kind::cpu);
  CHECK(parse_device("cuda").kind == device_kind::cuda);
  CHECK(parse_device("cuda:3").index == 3);
  const device a = parse_device("auto");
  if (cuda_device_count() > 0) {
    CHECK(a.kind == device_kind::cuda);
    CHECK(a.index == 0);
  } else {
    CHECK(a.kind == device_kind::cpu);
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""})
    CHECK_THROWS_WITH_AS(parse_device(bad), doctest::Contains("expected auto, cpu, cuda or cuda:N"),
                         std::invalid_argument);
}

TEST_CASE("cuda device requests without a visible device fail with the reason") {
  if (cuda_device_count() > 0) {
    MESSAGE("skipped: a CUDA device is visible (the GPU tests cover the working path)");
    return;
  }
  const std::string msg = error_of([] { backend_for({device_kind::cuda, 0}); });
  CHECK_MESSAGE(!msg.empty(), "backend_for(cuda:0) did not throw");
#ifdef COROLLA_HAVE_CUDA
  CHECK_MESSAGE(msg.find("no CUDA device is visible") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find(cuda::device_count_error()) != std::string::npos, msg);
  const std::string alloc =
      error_of([] { Tensor::empty({4}, dtype::f32, {device_kind::cuda, 0}); });
  CHECK_MESSAGE(alloc.find("no CUDA device is visible") != std::string::npos, alloc);
#else
  CHECK_MESSAGE(msg.find("built without CUDA") != std::string::npos, msg);
  CHECK_THROWS_WITH_AS(Tensor::empty({4}, dtype::f32, {device_kind::cuda, 0}),
                       doctest::Contains("no memory allocator is registered"), tensor_error);
#endif
}

TEST_CASE("tensors on a device refuse host-only operations instead of touching the bytes") {
  // A "device" tensor over host bytes: nothing below may read or write them
  // as host memory (storage::borrow needs no GPU).
  std::vector<float> bytes(8, 1.5f);
  auto st = storage::borrow(bytes.data(), bytes.size() * sizeof(float), nullptr,
                            {device_kind::cuda, 0});
  Tensor t = Tensor::wrap(st, 0, {8}, dtype::f32);
  CHECK_THROWS_WITH_AS(t.to(dtype::bf16), doctest::Contains("host tensors only"), tensor_error);
  CHECK_THROWS_WITH_AS(cpu_backend().scale(t, 2.0f), doctest::Contains("cuda:0"), tensor_error);
  Tensor host = Tensor::empty({8});
  CHECK_THROWS_WITH_AS(cpu_backend().copy(t, host), doctest::Contains("cuda:0"), tensor_error);
  if (cuda_device_count() == 0) {
    // Without a device the hooks fail loudly (no CUDA backend: no allocator
    // registered; CUDA backend: the runtime reports no device).
    CHECK_THROWS(t.zero());
    CHECK_THROWS(t.clone());
    CHECK_THROWS(t.to_vector());
    CHECK_THROWS(host.copy_from(t));
    CHECK(bytes == std::vector<float>(8, 1.5f));
  }
}

// ---- NCCL --------------------------------------------------------------------------------

#ifdef COROLLA_HAVE_NCCL
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/nccl_comm.hpp"

TEST_CASE("cuda: a one-rank NCCL group's collectives return their input") {
  REQUIRE_GPU_OR_SKIP();
  rng r(118);
  auto& be = static_cast<cuda::cuda_backend&>(gpu());
  CHECK(be.has_device_groups());
  std::unique_ptr<device_group> joined = be.join_group(be.new_group_id(), 0, 1, {});
  auto& group = dynamic_cast<cuda::nccl_group&>(*joined);
  CHECK(group.size() == 1);
  Tensor x = random_tensor({100}, r);
  Tensor dx = up(x), out = gpu().empty({100});
  group.all_reduce(be, dx, out);
  group.all_reduce(be, out, out);  // in place
  Tensor gathered = gpu().empty({100}), scattered = gpu().empty({100});
  group.all_gather(be, out, gathered);
  // On a companion's stream (the DP group's thread queues them there),
  // which is not ordered after be's: wait for the gather first.
  be.synchronize();
  std::unique_ptr<Backend> side = be.companion();
  group.reduce_scatter(*side, gathered, scattered);
  side->synchronize();
  CHECK(same_values(down(scattered), x));
  Tensor wrong = gpu().empty({99});
  CHECK_THROWS_AS(group.all_reduce(be, dx, wrong), tensor_error);
  CHECK_THROWS_WITH_AS(group.all_gather(cpu_backend(), dx, gathered), doctest::Contains("not cpu"), tensor_error);
  group.synchronize(be);  // nothing pending: returns at once
}
#endif
