// tests/cuda_emulated/moe_kernels.cpp — the row moves of a mixture-of-experts
// MLP (kernels/cuda/moe_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as kernels/cuda/moe.cu launches them,
// against the CPU backend's ops (Backend::moe_gather, moe_combine,
// moe_combine_weight_grad):
//  * the gather of rows by index, with and without per-row weights (an
//    index repeated, one never taken);
//  * the combine of each row's k slots in slot order, with and without
//    weights, overwriting and accumulating;
//  * the weights' gradient: one block of 128 threads per (row, slot) pair,
//    with rows narrower than the block (idle threads) and wider (threads
//    striding), then the block sum.
// Grid-stride loops run with grids too small to cover the rows at once. The
// gather moves values (bit for bit); the combine adds in the CPU's order;
// the gradient's block sum differs from the CPU's double sum only in
// rounding (rtol 1e-5). In bf16 and f16 rows (mixed-precision training)
// each kernel equals the f32 kernel run on the widened rows, its outputs
// rounded once to the storage type: bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/cuda_emulated/emulated_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/moe_kernels.cuh"

using namespace corolla;
using emulated_test::as;
using emulated_test::f;
using kernel_test::check_close;
using kernel_test::random_tensor;
using kernel_test::to_double;

namespace {

/// Two blocks of 64 threads: the grid-stride loops go round.
const emulated::launch_config strided{2, 1, 64, 0};

/// moe.cu's geometry for a grid-stride loop over n elements: 256 threads,
/// enough blocks to cover them once.
emulated::launch_config covering(std::int64_t n) { return {static_cast<unsigned>((n + 255) / 256), 1, 256, 0}; }

const std::int32_t* i32(const Tensor& t) { return t.data<std::int32_t>(); }

/// An i32 tensor of `shape` with values in [0, limit).
Tensor random_indices(const shape_t& shape, std::int32_t limit, kernel_test::rng& r) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::int32_t& x : v) x = r.integer(0, limit - 1);
  return Tensor::from_i32(v, shape);
}

}  // namespace

TEST_CASE("emulated moe gather kernel moves the cpu's rows, with and without weights") {
  kernel_test::rng r(1201);
  const std::int64_t n = 9, d = 37, m = 23;  // m * d = 851: several rounds of the strided grid
  const Tensor src = random_tensor({n, d}, r), weights = random_tensor({m}, r, -2.0f, 2.0f);
  // Sorted rows as the router makes them: every input row, some twice, one never.
  std::vector<std::int32_t> rows;
  for (std::int64_t i = 0; i < m; ++i) rows.push_back(static_cast<std::int32_t>((i * 5) % (n - 1)));
  const Tensor idx = Tensor::from_i32(rows, {m});
  for (const bool weighted : {false, true}) {
    CAPTURE(weighted);
    const Tensor* w = weighted ? &weights : nullptr;
    Tensor want = kernel_test::filled({m, d}, NAN);
    cpu_backend().moe_gather(src, idx, w, want);
    for (const emulated::launch_config& cfg : {strided, covering(m * d)}) {
      CAPTURE(cfg.grid_x);
      Tensor out = kernel_test::filled({m, d}, NAN);
      emulated::launch(&cuda::moe_gather_kernel<float>, cfg, f(src), i32(idx), weighted ? f(weights) : nullptr, f(out), m, d);
      CHECK(kernel_test::same_values(out, want));
    }
  }
  // Row 0's copy is row rows[0]'s, scaled by its weight.
  Tensor out = kernel_test::filled({m, d}, NAN);
  emulated::launch(&cuda::moe_gather_kernel<float>, strided, f(src), i32(idx), f(weights), f(out), m, d);
  const float* o = out.data<float>();
  const float* s = src.data<float>() + static_cast<std::int64_t>(rows[0]) * d;
  for (std::int64_t c = 0; c < d; ++c) CHECK(o[c] == s[c] * weights.data<float>()[0]);
}

TEST_CASE("emulated moe combine kernel sums each row's slots in order as the cpu does, overwriting or accumulating") {
  kernel_test::rng r(1202);
  const std::int64_t n = 11, k = 3, d = 29, m = n * k;
  const Tensor src = random_tensor({m, d}, r), weights = random_tensor({n, k}, r, 0.0f, 1.0f);
  // A permutation of the sorted rows (each row's k slots distinct), as the router's.
  std::vector<std::int32_t> perm(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) perm[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % m);
  const Tensor slots = Tensor::from_i32(perm, {n, k});
  // And slots drawn at random, repeats allowed (the op does not require distinct ones).
  const Tensor any_slots = random_indices({n, k}, static_cast<std::int32_t>(m), r);
  const Tensor start = random_tensor({n, d}, r);
  for (const Tensor* sl : {&slots, &any_slots})
    for (const bool weighted : {false, true})
      for (const bool accumulate : {false, true}) {
        CAPTURE(sl == &slots);
        CAPTURE(weighted);
        CAPTURE(accumulate);
        const Tensor* w = weighted ? &weights : nullptr;
        Tensor want = accumulate ? start.clone() : kernel_test::filled({n, d}, NAN);
        cpu_backend().moe_combine(src, *sl, w, accumulate, want);
        for (const emulated::launch_config& cfg : {strided, covering(n * d)}) {
          CAPTURE(cfg.grid_x);
          // Without accumulate the output's old contents must not matter: NaN.
          Tensor out = accumulate ? start.clone() : kernel_test::filled({n, d}, NAN);
          emulated::launch(&cuda::moe_combine_kernel<float>, cfg, f(src), i32(*sl), weighted ? f(weights) : nullptr, f(out),
                           n, k, d, accumulate);
          check_close(out, to_double(want), 1e-6, 1e-7, "moe_combine");
        }
      }
}

TEST_CASE("emulated moe weight-gradient kernel (a block sum per row and slot) matches the cpu") {
  kernel_test::rng r(1203);
  const std::int64_t n = 7, k = 2, m = 17;
  const Tensor slots = random_indices({n, k}, static_cast<std::int32_t>(m), r);
  // Rows narrower than the 128-thread block (idle threads) and wider (threads stride).
  for (const std::int64_t d : {std::int64_t{40}, std::int64_t{300}}) {
    CAPTURE(d);
    const Tensor dy = random_tensor({n, d}, r), src = random_tensor({m, d}, r);
    Tensor want = kernel_test::filled({n, k}, NAN), got = kernel_test::filled({n, k}, NAN);
    cpu_backend().moe_combine_weight_grad(dy, src, slots, want);
    emulated::launch(&cuda::moe_combine_weight_grad_kernel<float>, {static_cast<unsigned>(n * k), 1, 128, 0}, f(dy), f(src),
                     i32(slots), f(got), k, d);
    check_close(got, to_double(want), 1e-5, 1e-6, "moe_combine_weight_grad");
    // The exact dot product of the first pair, in double.
    double dot = 0;
    const float* g = dy.data<float>();
    const float* s = src.data<float>() + static_cast<std::int64_t>(i32(slots)[0]) * d;
    for (std::int64_t c = 0; c < d; ++c) dot += static_cast<double>(g[c]) * s[c];
    CHECK(got.data<float>()[0] == doctest::Approx(dot).epsilon(1e-5));
  }
}

namespace {

/// The three row moves in storage type T (host tensors of dtype `dt`) on
/// rows already representable in it: gather (weighted), combine
/// (weighted, accumulating) and the weights' gradient. Returns the gather's
/// and the combine's outputs widened to f32, and the gradient.
template <class T>
std::vector<Tensor> row_moves(dtype dt, const Tensor& src, const Tensor& rows, const Tensor& gather_w,
                              const Tensor& slots, const Tensor& combine_w, const Tensor& start, const Tensor& dy) {
  const std::int64_t m = rows.dim(0), d = src.dim(1), n = slots.dim(0), k = slots.dim(1);
  const Tensor s = src.to(dt), g = dy.to(dt);
  Tensor gathered = Tensor::empty({m, d}, dt), combined = start.to(dt);
  Tensor dweights = kernel_test::filled({n, k}, NAN);
  emulated::launch(&cuda::moe_gather_kernel<T>, strided, as<T>(s), i32(rows), f(gather_w), as<T>(gathered), m, d);
  emulated::launch(&cuda::moe_combine_kernel<T>, strided, as<T>(gathered), i32(slots), f(combine_w), as<T>(combined),
                   n, k, d, true);
  emulated::launch(&cuda::moe_combine_weight_grad_kernel<T>, {static_cast<unsigned>(n * k), 1, 128, 0}, as<T>(g),
                   as<T>(gathered), i32(slots), f(dweights), k, d);
  return {gathered.to(dtype::f32), combined.to(dtype::f32), dweights};
}

}  // namespace

TEST_CASE("emulated moe kernels in bf16 and f16 rows: the f32 kernels on the widened rows, rounded once on store") {
  kernel_test::rng r(1204);
  const std::int64_t n = 6, k = 2, d = 150, m = n * k;  // d over the 128-thread block: the gradient's threads stride
  const Tensor gather_w = random_tensor({m}, r, -2.0f, 2.0f), combine_w = random_tensor({n, k}, r, 0.0f, 1.0f);
  std::vector<std::int32_t> rows_v, perm;
  for (std::int64_t i = 0; i < m; ++i) {
    rows_v.push_back(static_cast<std::int32_t>((i * 5) % n));
    perm.push_back(static_cast<std::int32_t>((i * 7 + 3) % m));
  }
  const Tensor rows = Tensor::from_i32(rows_v, {m}), slots = Tensor::from_i32(perm, {n, k});
  for (const dtype dt : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(dt));
    // Inputs representable in dt, so that the f32 run sees the same values.
    const Tensor src = random_tensor({n, d}, r).to(dt).to(dtype::f32);
    const Tensor start = random_tensor({n, d}, r).to(dt).to(dtype::f32);
    const Tensor dy = random_tensor({n, d}, r).to(dt).to(dtype::f32);
    const std::vector<Tensor> got = dt == dtype::bf16
                                        ? row_moves<__nv_bfloat16>(dt, src, rows, gather_w, slots, combine_w, start, dy)
                                        : row_moves<__half>(dt, src, rows, gather_w, slots, combine_w, start, dy);
    // The f32 kernels: the gather rounded to dt before the combine reads it,
    // as the 16-bit run stores it; each output rounded once.
    Tensor gathered = kernel_test::filled({m, d}, NAN);
    emulated::launch(&cuda::moe_gather_kernel<float>, strided, f(src), i32(rows), f(gather_w), f(gathered), m, d);
    const Tensor stored = gathered.to(dt).to(dtype::f32);
    Tensor combined = start.clone(), dweights = kernel_test::filled({n, k}, NAN);
    emulated::launch(&cuda::moe_combine_kernel<float>, strided, f(stored), i32(slots), f(combine_w), f(combined), n, k,
                     d, true);
    emulated::launch(&cuda::moe_combine_weight_grad_kernel<float>, {static_cast<unsigned>(n * k), 1, 128, 0}, f(dy),
                     f(stored), i32(slots), f(dweights), k, d);
    CHECK(kernel_test::same_values(got[0], stored));
    CHECK(kernel_test::same_values(got[1], combined.to(dt).to(dtype::f32)));
    CHECK(kernel_test::same_values(got[2], dweights));
    // And not merely the f32 result: a 16-bit store rounds (some value moved).
    CHECK_FALSE(kernel_test::same_values(got[1], combined));
  }
}
