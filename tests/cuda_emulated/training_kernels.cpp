// tests/cuda_emulated/training_kernels.cpp — the kernels every training step
// runs besides GEMM and attention (kernels/cuda/norm_kernels.cuh,
// loss_optim_kernels.cuh, rope_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as their .cu launchers launch them,
// against the CPU backend: RMSNorm and LayerNorm forward (256- and
// 1024-thread rows) and backward (the 32 x 32 column sums of the parameter
// gradients, accumulated, with a partial last tile), the fused add + RMSNorm, softmax cross-entropy
// (ignored rows, dlogits aliasing the logits), AdamW (and AdamW writing
// the 16-bit compute copy, bit for bit the update then the rounding), RoPE and its inverse,
// and RoPE + KV append. Only summation order differs from the CPU (rtol
// 1e-5). In bf16 and f16 storage the norm, RoPE and cross-entropy kernels
// must equal the f32 kernels on the widened inputs, rounded once.
// tests/kernels/cuda_ops.cpp checks the same on a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/cuda_emulated/emulated_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/loss_optim_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/cuda/rope_kernels.cuh"
#include "tests/cuda_emulated/emulated_column_sums.hpp"

using namespace corolla;
using emulated_test::as;
using emulated_test::launch_column_sums;
using emulated_test::f;
using emulated_test::rounded_to;
using emulated_test::widened;
using kernel_test::check_close;
using kernel_test::random_tensor;
using kernel_test::to_double;

namespace {

constexpr double rel_tol = 1e-5, abs_tol = 1e-6;
/// Parameter gradients: sums over 70 rows of terms up to about 3 in
/// magnitude, whose order differs from the cpu's (f32 rounding of a few
/// 1e-6; one row lost or counted twice is 1e-2 or more).
constexpr double sum_abs_tol = 1e-5;

/// The norm backward kernels' dres when nothing is added.
template <class T>
constexpr const T* no_residual = nullptr;

emulated::launch_config rows_of(std::int64_t n, unsigned threads) { return {static_cast<unsigned>(n), 1, threads, 0}; }

}  // namespace

TEST_CASE("emulated RMSNorm and LayerNorm kernels match the cpu, forward and backward") {
  kernel_test::rng r(907);
  const std::int64_t n = 3;
  for (const std::int64_t d : {std::int64_t{80}, std::int64_t{1100}}) {  // fewer and more columns than threads
    CAPTURE(d);
    const Tensor x = random_tensor({n, d}, r), b2 = random_tensor({n, d}, r), w = random_tensor({d}, r, 0.5f, 1.5f);
    const Tensor bias = random_tensor({d}, r);
    for (const unsigned threads : {256u, 1024u}) {
      CAPTURE(threads);
      Tensor y = Tensor::empty({n, d}), rstd = Tensor::empty({n}), want_y = Tensor::empty({n, d}),
             want_rstd = Tensor::empty({n});
      cpu_backend().rmsnorm(x, w, 1e-5f, want_y, &want_rstd);
      emulated::launch(&cuda::rmsnorm_forward_kernel<float>, rows_of(n, threads), f(x), f(w), 1e-5f, f(y), f(rstd), d);
      check_close(y, to_double(want_y), rel_tol, abs_tol, "rmsnorm y");
      check_close(rstd, to_double(want_rstd), rel_tol, abs_tol, "rmsnorm rstd");

      Tensor sum = Tensor::empty({n, d}), want_sum = Tensor::empty({n, d});
      cpu_backend().add_rmsnorm(x, b2, want_sum, w, 1e-5f, want_y);
      emulated::launch(&cuda::add_rmsnorm_kernel<float>, rows_of(n, threads), f(x), f(b2), f(sum), f(w), 1e-5f, f(y), d);
      check_close(sum, to_double(want_sum), 0, 0, "add_rmsnorm sum");
      check_close(y, to_double(want_y), rel_tol, abs_tol, "add_rmsnorm y");

      Tensor mean = Tensor::empty({n}), want_mean = Tensor::empty({n});
      cpu_backend().layernorm(x, w, bias, 1e-5f, want_y, &want_mean, &want_rstd);
      emulated::launch(&cuda::layernorm_forward_kernel<float>, rows_of(n, threads), f(x), f(w), f(bias), 1e-5f, f(y), f(mean),
                       f(rstd), d);
      check_close(y, to_double(want_y), rel_tol, abs_tol, "layernorm y");
      check_close(mean, to_double(want_mean), rel_tol, abs_tol, "layernorm mean");
      check_close(rstd, to_double(want_rstd), rel_tol, abs_tol, "layernorm rstd");
    }

    // Backward: dx overwritten, the parameter gradients added to what is
    // there. Narrow rows only (every column tile is a 1024-thread block, and
    // the emulation starts a thread per CUDA thread), but more rows than a
    // tile's 32 threads along y; dx of the first rows (a block each). The
    // parameter gradients in one chunk of rows, and in three (32, 32 and 6
    // rows: the partial sums, then column_partials_kernel).
    if (d > 256) continue;
    const std::int64_t rows = 70, dx_rows = 3;
    for (const std::int64_t chunk_rows : {rows, std::int64_t{32}}) {
      CAPTURE(chunk_rows);
      const Tensor xb = random_tensor({rows, d}, r), dyb = random_tensor({rows, d}, r);
      Tensor rstd = Tensor::empty({rows}), mean = Tensor::empty({rows}), y = Tensor::empty({rows, d});
      auto first_rows = [&](const Tensor& t) {
        std::vector<double> v = to_double(t);
        v.resize(static_cast<std::size_t>(dx_rows * d));
        return v;
      };
      cpu_backend().rmsnorm(xb, w, 1e-5f, y, &rstd);
      Tensor dx = Tensor::empty({dx_rows, d}), want_dx = Tensor::empty({rows, d});
      Tensor dw = kernel_test::filled({d}, 0.25f), want_dw = kernel_test::filled({d}, 0.25f);
      cpu_backend().rmsnorm_backward(xb, w, rstd, dyb, want_dx, want_dw);
      emulated::launch(&cuda::rmsnorm_backward_dx_kernel<float>, rows_of(dx_rows, cuda::row_threads), f(xb), f(w),
                       f(rstd), f(dyb), f(dx), d, no_residual<float>);
      launch_column_sums<1>(&cuda::rmsnorm_backward_dw_kernel<float>, rows, d, chunk_rows, {f(dw)}, f(xb), f(rstd),
                            f(dyb), rows, d);
      check_close(dx, first_rows(want_dx), rel_tol, abs_tol, "rmsnorm dx");
      check_close(dw, to_double(want_dw), rel_tol, sum_abs_tol, "rmsnorm dw");

      cpu_backend().layernorm(xb, w, bias, 1e-5f, y, &mean, &rstd);
      Tensor db = kernel_test::filled({d}, -0.5f), want_db = kernel_test::filled({d}, -0.5f);
      dw = kernel_test::filled({d}, 0.25f);
      want_dw = kernel_test::filled({d}, 0.25f);
      cpu_backend().layernorm_backward(xb, w, mean, rstd, dyb, want_dx, want_dw, want_db);
      emulated::launch(&cuda::layernorm_backward_dx_kernel<float>, rows_of(dx_rows, cuda::row_threads), f(xb), f(w),
                       f(mean), f(rstd), f(dyb), f(dx), d, no_residual<float>);
      launch_column_sums<2>(&cuda::layernorm_backward_dwdb_kernel<float>, rows, d, chunk_rows, {f(dw), f(db)}, f(xb),
                            f(mean), f(rstd), f(dyb), rows, d);
      check_close(dx, first_rows(want_dx), rel_tol, abs_tol, "layernorm dx");
      check_close(dw, to_double(want_dw), rel_tol, sum_abs_tol, "layernorm dw");
      check_close(db, to_double(want_db), rel_tol, sum_abs_tol, "layernorm db");
    }
  }
}

TEST_CASE("emulated cross-entropy and AdamW kernels match the cpu") {
  kernel_test::rng r(911);
  const std::int64_t n = 4, vocab = 700;
  const Tensor logits = random_tensor({n, vocab}, r, -4.0f, 4.0f);
  const std::vector<std::int32_t> ids = {5, -1, 699, 0};  // -1: an ignored row
  const Tensor targets = Tensor::from_i32(ids, {n});
  Tensor want_losses = Tensor::empty({n}), want_d = Tensor::empty({n, vocab});
  cpu_backend().cross_entropy(logits, targets, want_losses, &want_d, 0.25f);
  // dlogits aliasing the logits, as the model's head does.
  Tensor l = logits.clone(), losses = Tensor::empty({n});
  emulated::launch(&cuda::cross_entropy_kernel<float>, rows_of(n, cuda::ce_threads), f(l), targets.data<std::int32_t>(),
                   f(losses), f(l), 0.25f, vocab);
  check_close(losses, to_double(want_losses), rel_tol, abs_tol, "cross-entropy losses");
  check_close(l, to_double(want_d), rel_tol, abs_tol, "cross-entropy dlogits");
  // Without dlogits: only the losses.
  Tensor untouched = logits.clone();
  emulated::launch(&cuda::cross_entropy_kernel<float>, rows_of(n, cuda::ce_threads), f(untouched),
                   targets.data<std::int32_t>(), f(losses), static_cast<float*>(nullptr), 0.25f, vocab);
  check_close(losses, to_double(want_losses), rel_tol, abs_tol, "cross-entropy losses without dlogits");
  CHECK(kernel_test::same_values(untouched, logits));

  // AdamW: the four-a-thread kernel (what the launcher runs on the aligned
  // flat buffers) against the cpu; 1003 parameters: 250 groups of four over
  // two blocks of 64 threads (the grid-stride loop wraps) and three past
  // them (the first threads' tail).
  const std::int64_t count = 1003;
  const emulated::launch_config two_blocks{2, 1, 64, 0};
  Tensor p = random_tensor({count}, r), g = random_tensor({count}, r), m = random_tensor({count}, r, -0.1f, 0.1f),
         v = random_tensor({count}, r, 0.0f, 0.01f);
  const auto no_copy = static_cast<cuda::adamw_no_copy*>(nullptr);
  Tensor want_p = p.clone(), want_m = m.clone(), want_v = v.clone();
  adamw_params hp;
  hp.lr = 3e-3f;
  hp.weight_decay = 0.1f;
  cpu_backend().adamw(want_p, g, want_m, want_v, hp, 7);
  emulated::launch(&cuda::adamw_vec4_kernel<cuda::adamw_no_copy>, two_blocks, f(p), f(g), f(m), f(v), no_copy,
                   adamw_scalars_for(hp, 7), count);
  check_close(p, to_double(want_p), rel_tol, abs_tol, "adamw params");
  check_close(m, to_double(want_m), rel_tol, abs_tol, "adamw m");
  check_close(v, to_double(want_v), rel_tol, abs_tol, "adamw v");
  // grad_scale (unscaling and clipping folded in): as the cpu with it.
  hp.grad_scale = 0.125f;
  cpu_backend().adamw(want_p, g, want_m, want_v, hp, 8);
  emulated::launch(&cuda::adamw_vec4_kernel<cuda::adamw_no_copy>, two_blocks, f(p), f(g), f(m), f(v), no_copy,
                   adamw_scalars_for(hp, 8), count);
  check_close(p, to_double(want_p), rel_tol, abs_tol, "adamw params, scaled gradients");
  check_close(m, to_double(want_m), rel_tol, abs_tol, "adamw m, scaled gradients");
  check_close(v, to_double(want_v), rel_tol, abs_tol, "adamw v, scaled gradients");
  // The scalar kernel (the launcher's form for unaligned pointers) computes
  // the same bits, one parameter a thread.
  const Tensor p0 = p.clone(), m0 = m.clone(), v0 = v.clone();
  emulated::launch(&cuda::adamw_vec4_kernel<cuda::adamw_no_copy>, two_blocks, f(p), f(g), f(m), f(v), no_copy,
                   adamw_scalars_for(hp, 9), count);
  {
    Tensor p1 = p0.clone(), m1 = m0.clone(), v1 = v0.clone();
    emulated::launch(&cuda::adamw_kernel<cuda::adamw_no_copy>, {2, 1, 256, 0}, f(p1), f(g), f(m1), f(v1), no_copy,
                     adamw_scalars_for(hp, 9), count);
    CHECK(kernel_test::same_values(p1, p));
    CHECK(kernel_test::same_values(m1, m));
    CHECK(kernel_test::same_values(v1, v));
  }
  // The update that also writes the 16-bit compute copy, in both forms: the
  // same parameters, m and v, and the copy each parameter rounded once, as
  // the conversion kernel stores it.
  for (const dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    for (const bool vec4 : {true, false}) {
      CAPTURE(vec4);
      Tensor p2 = p0.clone(), m2 = m0.clone(), v2 = v0.clone(), copy = Tensor::empty({count}, t);
      const adamw_step_scalars k = adamw_scalars_for(hp, 9);
      if (t == dtype::bf16) {
        auto* c = static_cast<__nv_bfloat16*>(copy.raw());
        if (vec4)
          emulated::launch(&cuda::adamw_vec4_kernel<__nv_bfloat16>, two_blocks, f(p2), f(g), f(m2), f(v2), c, k, count);
        else
          emulated::launch(&cuda::adamw_kernel<__nv_bfloat16>, {2, 1, 256, 0}, f(p2), f(g), f(m2), f(v2), c, k, count);
      } else {
        auto* c = static_cast<__half*>(copy.raw());
        if (vec4)
          emulated::launch(&cuda::adamw_vec4_kernel<__half>, two_blocks, f(p2), f(g), f(m2), f(v2), c, k, count);
        else
          emulated::launch(&cuda::adamw_kernel<__half>, {2, 1, 256, 0}, f(p2), f(g), f(m2), f(v2), c, k, count);
      }
      CHECK(kernel_test::same_values(p2, p));
      CHECK(kernel_test::same_values(m2, m));
      CHECK(kernel_test::same_values(v2, v));
      CHECK(kernel_test::same_values(copy, p.to(t)));
    }
  }
}

TEST_CASE("emulated RoPE and RoPE + KV-append kernels match the cpu") {
  kernel_test::rng r(919);
  const std::int64_t n = 5;
  const int hq = 4, hkv = 2, dh = 16;
  const std::vector<std::int32_t> pos = {0, 1, 7, 300, 4095};
  const Tensor positions = Tensor::from_i32(pos, {n});
  for (const bool inverse : {false, true}) {
    CAPTURE(inverse);
    const Tensor x = random_tensor({n, hq * dh}, r);
    Tensor want = x.clone(), got = x.clone();
    cpu_backend().rope(want, positions, hq, dh, 10000.0f, inverse);
    emulated::launch(&cuda::rope_kernel<float>, {3, 1, 64, 0}, f(got), positions.data<std::int32_t>(), n, hq, dh, 10000.0,
                     inverse ? -1.0f : 1.0f);
    check_close(got, to_double(want), rel_tol, abs_tol, "rope");
  }
  for (const bool rotate : {true, false}) {
    CAPTURE(rotate);
    const Tensor q = random_tensor({n, hq * dh}, r), k = random_tensor({n, hkv * dh}, r),
                 v = random_tensor({n, hkv * dh}, r);
    Tensor want_q = q.clone(), want_k = k.clone(), want_k_out = Tensor::empty({n, hkv * dh}),
           want_v_out = Tensor::empty({n, hkv * dh});
    cpu_backend().rope_store_kv(want_q, want_k, v, positions, hq, hkv, dh, 10000.0f, rotate, f(want_k_out),
                                f(want_v_out), dtype::f32);
    Tensor got_q = q.clone(), k_out = kernel_test::filled({n, hkv * dh}, NAN), v_out = kernel_test::filled({n, hkv * dh}, NAN);
    emulated::launch(&cuda::rope_store_kv_kernel<float>, {4, 1, 64, 0}, f(got_q), f(k), f(v),
                     positions.data<std::int32_t>(), n, hq, hkv, dh, 10000.0, rotate, f(k_out), f(v_out));
    check_close(got_q, to_double(want_q), rel_tol, abs_tol, "rope_store_kv q");
    check_close(k_out, to_double(want_k_out), rel_tol, abs_tol, "rope_store_kv k");
    check_close(v_out, to_double(want_v_out), 0, 0, "rope_store_kv v");
    // Into a bf16 cache: the same rows, rounded once.
    Tensor q16 = q.clone(), k16 = Tensor::empty({n, hkv * dh}, dtype::bf16), v16 = Tensor::empty({n, hkv * dh}, dtype::bf16);
    emulated::launch(&cuda::rope_store_kv_kernel<__nv_bfloat16>, {4, 1, 64, 0}, f(q16), f(k), f(v),
                     positions.data<std::int32_t>(), n, hq, hkv, dh, 10000.0, rotate,
                     static_cast<__nv_bfloat16*>(k16.raw()), static_cast<__nv_bfloat16*>(v16.raw()));
    CHECK(k16.to_vector() == k_out.to(dtype::bf16).to_vector());
    CHECK(v16.to_vector() == v_out.to(dtype::bf16).to_vector());
    CHECK(q16.to_vector() == got_q.to_vector());
  }
}

TEST_CASE("emulated RoPE and cache store of rows of different sequences (a decode batch) match the cpu") {
  kernel_test::rng r(921);
  const std::int64_t n = 4;
  const int hq = 4, hkv = 2, dh = 16;
  const std::int64_t kw = std::int64_t{hkv} * dh;
  const std::vector<std::int32_t> pos = {3, 0, 77, 12};
  const Tensor positions = Tensor::from_i32(pos, {n});
  for (const bool rotate : {true, false}) {
    CAPTURE(rotate);
    const Tensor q = random_tensor({n, hq * dh}, r), k = random_tensor({n, kw}, r), v = random_tensor({n, kw}, r);
    // The destinations: rows of two "pages" in no particular order.
    Tensor want_pages = kernel_test::filled({8, kw}, NAN), got_pages = kernel_test::filled({8, kw}, NAN);
    const std::int64_t slot[n] = {5, 0, 7, 2};
    std::vector<void*> want_k, want_v, got_k, got_v;
    for (std::int64_t i = 0; i < n; ++i) {
      want_k.push_back(want_pages.data<float>() + slot[i] * kw);
      want_v.push_back(want_pages.data<float>() + (slot[i] ^ 1) * kw);
      got_k.push_back(got_pages.data<float>() + slot[i] * kw);
      got_v.push_back(got_pages.data<float>() + (slot[i] ^ 1) * kw);
    }
    // Each row's destination as a cache of one-token pages whose page at
    // the row's position is that row (every earlier page the same row:
    // nothing null within the length).
    std::vector<std::vector<const void*>> k_pages(n), v_pages(n);
    std::vector<kv_pages_view> views;
    std::vector<std::int64_t> starts;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::size_t>(i);
      k_pages[u].assign(static_cast<std::size_t>(pos[u] + 1), want_k[u]);
      v_pages[u].assign(static_cast<std::size_t>(pos[u] + 1), want_v[u]);
      views.push_back(kv_pages_view{k_pages[u], v_pages[u], 1, pos[u] + 1});
      starts.push_back(pos[u]);
    }
    Tensor want_q = q.clone(), want_kr = k.clone();
    cpu_backend().rope_store_kv_pages(want_q, want_kr, v, positions, hq, hkv, dh, views, starts, 10000.0f, rotate);
    // The cpu's default is rope_store_kv row by row.
    Tensor one_q = q.clone(), one_k = k.clone(), one_pages = kernel_test::filled({8, kw}, NAN);
    for (std::int64_t i = 0; i < n; ++i) {
      Tensor qi = one_q.slice(i, i + 1), ki = one_k.slice(i, i + 1);
      cpu_backend().rope_store_kv(qi, ki, v.slice(i, i + 1), positions.slice(i, i + 1), hq, hkv, dh, 10000.0f,
                                  rotate, one_pages.data<float>() + slot[i] * kw,
                                  one_pages.data<float>() + (slot[i] ^ 1) * kw, dtype::f32);
    }
    CHECK(one_pages.to_vector() == want_pages.to_vector());
    Tensor got_q = q.clone();
    std::vector<float*> k_rows, v_rows;
    for (std::int64_t i = 0; i < n; ++i) {
      k_rows.push_back(static_cast<float*>(got_k[static_cast<std::size_t>(i)]));
      v_rows.push_back(static_cast<float*>(got_v[static_cast<std::size_t>(i)]));
    }
    emulated::launch(&cuda::rope_store_kv_rows_kernel<float>, {4, 1, 64, 0}, f(got_q), f(k), f(v),
                     positions.data<std::int32_t>(), n, hq, hkv, dh, 10000.0, rotate,
                     static_cast<float* const*>(k_rows.data()), static_cast<float* const*>(v_rows.data()));
    check_close(got_q, to_double(want_q), rel_tol, abs_tol, "rope_store_kv_rows q");
    // Every destination row written, as the cpu wrote it; the rows between untouched.
    const std::vector<float> got = got_pages.to_vector(), want = want_pages.to_vector();
    for (std::size_t e = 0; e < got.size(); ++e) {
      if (std::isnan(want[e])) {
        CHECK(std::isnan(got[e]));
        continue;
      }
      CHECK(std::abs(got[e] - want[e]) <= abs_tol + rel_tol * std::abs(want[e]));
    }

    // The same rows found through page tables as a kv_sequence keeps them
    // on a device (pages of 8 tokens; two layers' keys and values
    // interleaved a page, this the second layer): the kernel writes the
    // same floats to the same rows.
    const std::int64_t page_tokens = 8, stride = 4, key_entry = 2;
    std::vector<std::vector<float*>> tables(n);
    std::vector<float* const*> row_tables;
    std::vector<std::int64_t> row_keys;
    // The destinations are rows 8.. of 16: a page's base (before its row) stays within.
    Tensor paged = kernel_test::filled({16, kw}, NAN);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::size_t>(i);
      const std::int64_t page = pos[u] / page_tokens, in_page = pos[u] % page_tokens;
      tables[u].assign(static_cast<std::size_t>((page + 1) * stride), nullptr);
      // The page's base such that its row in_page is the destination row.
      tables[u][static_cast<std::size_t>(key_entry + page * stride)] = paged.data<float>() + (8 + slot[i] - in_page) * kw;
      tables[u][static_cast<std::size_t>(key_entry + 1 + page * stride)] =
          paged.data<float>() + (8 + (slot[i] ^ 1) - in_page) * kw;
      row_tables.push_back(tables[u].data());
      row_keys.push_back(pos[u] + 1);
    }
    Tensor paged_q = q.clone();
    emulated::launch(&cuda::rope_store_kv_pages_kernel<float>, {4, 1, 64, 0}, f(paged_q), f(k), f(v),
                     positions.data<std::int32_t>(), n, hq, hkv, dh, 10000.0, rotate,
                     cuda::paged_rows<float>{row_tables.data(), row_keys.data(), key_entry, key_entry + 1, stride,
                                             page_tokens});
    CHECK(paged_q.to_vector() == got_q.to_vector());
    const std::vector<float> from_tables = paged.to_vector();
    for (std::size_t e = 0; e < got.size(); ++e) {
      CHECK(std::isnan(from_tables[e]));  // rows 0..7: untouched
      const float at = from_tables[got.size() + e];
      CHECK((std::isnan(got[e]) ? std::isnan(at) : at == got[e]));
    }
  }
}

TEST_CASE("emulated RoPE kernels with HF's rope_scaling (linear, llama3, yarn) match the cpu") {
  kernel_test::rng r(920);
  const std::int64_t n = 4;
  const int hq = 2, hkv = 1, dh = 32;
  const std::vector<std::int32_t> pos = {0, 5, 900, 20000};
  const Tensor positions = Tensor::from_i32(pos, {n});
  rope_spec linear(500000.0), llama3(500000.0), yarn(1000000.0);
  linear.kind = rope_kind::linear;
  linear.factor = 2.5;
  llama3.kind = rope_kind::llama3;
  llama3.factor = 8;
  llama3.original_max_positions = 64;
  yarn.kind = rope_kind::yarn;
  yarn.factor = 4;
  yarn.ramp_low = 3;
  yarn.ramp_high = 9;
  yarn.attention_factor = 1.1386;
  for (const rope_spec& spec : {linear, llama3, yarn}) {
    CAPTURE(static_cast<int>(spec.kind));
    for (const bool inverse : {false, true}) {
      const Tensor x = random_tensor({n, hq * dh}, r);
      Tensor want = x.clone(), got = x.clone(), plain = x.clone();
      cpu_backend().rope(want, positions, hq, dh, spec, inverse);
      cpu_backend().rope(plain, positions, hq, dh, rope_spec(spec.theta), inverse);
      emulated::launch(&cuda::rope_kernel<float>, {3, 1, 64, 0}, f(got), positions.data<std::int32_t>(), n, hq, dh, spec,
                       inverse ? -1.0f : 1.0f);
      check_close(got, to_double(want), rel_tol, abs_tol, "scaled rope");
      // The scaling changes the rotation (the comparison has teeth).
      double moved = 0;
      const std::vector<float> a = want.to_vector(), b = plain.to_vector();
      for (std::size_t i = 0; i < a.size(); ++i) moved = std::max(moved, double(std::abs(a[i] - b[i])));
      CHECK(moved > 1e-2);
    }
    const Tensor q = random_tensor({n, hq * dh}, r), k = random_tensor({n, hkv * dh}, r), v = random_tensor({n, hkv * dh}, r);
    Tensor want_q = q.clone(), want_k = k.clone(), want_k_out = Tensor::empty({n, hkv * dh}),
           want_v_out = Tensor::empty({n, hkv * dh});
    cpu_backend().rope_store_kv(want_q, want_k, v, positions, hq, hkv, dh, spec, true, f(want_k_out), f(want_v_out),
                                dtype::f32);
    Tensor got_q = q.clone(), k_out = Tensor::empty({n, hkv * dh}), v_out = Tensor::empty({n, hkv * dh});
    emulated::launch(&cuda::rope_store_kv_kernel<float>, {4, 1, 64, 0}, f(got_q), f(k), f(v),
                     positions.data<std::int32_t>(), n, hq, hkv, dh, spec, true, f(k_out), f(v_out));
    check_close(got_q, to_double(want_q), rel_tol, abs_tol, "scaled rope_store_kv q");
    check_close(k_out, to_double(want_k_out), rel_tol, abs_tol, "scaled rope_store_kv k");
  }
}

namespace {

/// The 16-bit kernels against the f32 ones on the widened inputs: the
/// arithmetic is the same f32, so the 16-bit outputs are the f32 outputs
/// rounded once, and the f32 outputs (statistics, parameter gradients,
/// losses) are equal.
template <class T>
void check_16bit(dtype dt, kernel_test::rng& r) {
  const std::int64_t n = 3, d = 72;
  const Tensor x = random_tensor({n, d}, r).to(dt), b2 = random_tensor({n, d}, r).to(dt),
               dy = random_tensor({n, d}, r).to(dt);
  const Tensor w = random_tensor({d}, r, 0.5f, 1.5f), bias = random_tensor({d}, r);
  const Tensor xw = x.to(dtype::f32), b2w = b2.to(dtype::f32), dyw = dy.to(dtype::f32);
  const std::string name = dtype_name(dt);

  Tensor y = Tensor::empty({n, d}, dt), yw = Tensor::empty({n, d}), rstd = Tensor::empty({n}),
         rstdw = Tensor::empty({n}), mean = Tensor::empty({n}), meanw = Tensor::empty({n});
  emulated::launch(&cuda::rmsnorm_forward_kernel<T>, rows_of(n, 256), as<T>(x), f(w), 1e-5f, as<T>(y), f(rstd), d);
  emulated::launch(&cuda::rmsnorm_forward_kernel<float>, rows_of(n, 256), f(xw), f(w), 1e-5f, f(yw), f(rstdw), d);
  check_close(widened(y), rounded_to(yw, dt), 0, 0, "rmsnorm y in " + name);
  check_close(rstd, to_double(rstdw), 0, 0, "rmsnorm rstd in " + name);

  // add + rmsnorm equals add (f32, rounded once), then rmsnorm of that sum.
  Tensor sum = Tensor::empty({n, d}, dt), sum2 = Tensor::empty({n, d}, dt), y2 = Tensor::empty({n, d}, dt);
  emulated::launch(&cuda::add_rmsnorm_kernel<T>, rows_of(n, 256), as<T>(x), as<T>(b2), as<T>(sum), f(w), 1e-5f,
                   as<T>(y), d);
  Tensor sum_wide = Tensor::empty({n, d});
  cpu_backend().add(xw, b2w, sum_wide);  // f32 add, then one rounding: what the add kernel stores
  sum2.copy_from(sum_wide.to(dt));
  emulated::launch(&cuda::rmsnorm_forward_kernel<T>, rows_of(n, 256), as<T>(sum2), f(w), 1e-5f, as<T>(y2),
                   static_cast<float*>(nullptr), d);
  CHECK(kernel_test::same_values(sum, sum2));
  CHECK(kernel_test::same_values(y, y2));

  Tensor dx = Tensor::empty({n, d}, dt), dxw = Tensor::empty({n, d});
  Tensor dw = kernel_test::filled({d}, 0.25f), dww = kernel_test::filled({d}, 0.25f);
  emulated::launch(&cuda::rmsnorm_backward_dx_kernel<T>, rows_of(n, cuda::row_threads), as<T>(x), f(w), f(rstd),
                   as<T>(dy), as<T>(dx), d, no_residual<T>);
  emulated::launch(&cuda::rmsnorm_backward_dx_kernel<float>, rows_of(n, cuda::row_threads), f(xw), f(w), f(rstd),
                   f(dyw), f(dxw), d, no_residual<float>);
  launch_column_sums<1>(&cuda::rmsnorm_backward_dw_kernel<T>, n, d, n, {f(dw)}, as<T>(x), f(rstd), as<T>(dy), n, d);
  launch_column_sums<1>(&cuda::rmsnorm_backward_dw_kernel<float>, n, d, n, {f(dww)}, f(xw), f(rstd), f(dyw), n, d);
  check_close(widened(dx), rounded_to(dxw, dt), 0, 0, "rmsnorm dx in " + name);
  check_close(dw, to_double(dww), 0, 0, "rmsnorm dw in " + name);

  // With the residual's gradient added (rmsnorm_backward_add): the f32
  // kernel's dx plus the residual, rounded once; in f32, bit for bit the
  // add kernel's sum of the residual and the f32 dx.
  Tensor dres = random_tensor({n, d}, r).to(dt);
  const Tensor dresw = dres.to(dtype::f32);
  Tensor dxr = Tensor::empty({n, d}, dt), dxrw = Tensor::empty({n, d}), sumw = Tensor::empty({n, d});
  emulated::launch(&cuda::rmsnorm_backward_dx_kernel<T>, rows_of(n, cuda::row_threads), as<T>(x), f(w), f(rstd),
                   as<T>(dy), as<T>(dxr), d, static_cast<const T*>(as<T>(dres)));
  emulated::launch(&cuda::rmsnorm_backward_dx_kernel<float>, rows_of(n, cuda::row_threads), f(xw), f(w), f(rstd),
                   f(dyw), f(dxrw), d, static_cast<const float*>(f(dresw)));
  check_close(widened(dxr), rounded_to(dxrw, dt), 0, 0, "rmsnorm dx + dres in " + name);
  cpu_backend().add(dresw, dxw, sumw);
  check_close(dxrw, to_double(sumw), 0, 0, "rmsnorm dx + dres in f32: dx, then add");
  CHECK_FALSE(kernel_test::same_values(dxrw, dxw));  // the residual did arrive

  emulated::launch(&cuda::layernorm_forward_kernel<T>, rows_of(n, 256), as<T>(x), f(w), f(bias), 1e-5f, as<T>(y),
                   f(mean), f(rstd), d);
  emulated::launch(&cuda::layernorm_forward_kernel<float>, rows_of(n, 256), f(xw), f(w), f(bias), 1e-5f, f(yw),
                   f(meanw), f(rstdw), d);
  check_close(widened(y), rounded_to(yw, dt), 0, 0, "layernorm y in " + name);
  check_close(mean, to_double(meanw), 0, 0, "layernorm mean in " + name);
  check_close(rstd, to_double(rstdw), 0, 0, "layernorm rstd in " + name);
  Tensor db = kernel_test::filled({d}, -0.5f), dbw = kernel_test::filled({d}, -0.5f);
  emulated::launch(&cuda::layernorm_backward_dx_kernel<T>, rows_of(n, cuda::row_threads), as<T>(x), f(w), f(mean),
                   f(rstd), as<T>(dy), as<T>(dx), d, no_residual<T>);
  emulated::launch(&cuda::layernorm_backward_dx_kernel<float>, rows_of(n, cuda::row_threads), f(xw), f(w), f(mean),
                   f(rstd), f(dyw), f(dxw), d, no_residual<float>);
  launch_column_sums<2>(&cuda::layernorm_backward_dwdb_kernel<T>, n, d, n, {f(dw), f(db)}, as<T>(x), f(mean), f(rstd),
                        as<T>(dy), n, d);
  launch_column_sums<2>(&cuda::layernorm_backward_dwdb_kernel<float>, n, d, n, {f(dww), f(dbw)}, f(xw), f(mean),
                        f(rstd), f(dyw), n, d);
  check_close(widened(dx), rounded_to(dxw, dt), 0, 0, "layernorm dx in " + name);
  check_close(dw, to_double(dww), 0, 0, "layernorm dw in " + name);
  check_close(db, to_double(dbw), 0, 0, "layernorm db in " + name);
  emulated::launch(&cuda::layernorm_backward_dx_kernel<T>, rows_of(n, cuda::row_threads), as<T>(x), f(w), f(mean),
                   f(rstd), as<T>(dy), as<T>(dxr), d, static_cast<const T*>(as<T>(dres)));
  emulated::launch(&cuda::layernorm_backward_dx_kernel<float>, rows_of(n, cuda::row_threads), f(xw), f(w), f(mean),
                   f(rstd), f(dyw), f(dxrw), d, static_cast<const float*>(f(dresw)));
  check_close(widened(dxr), rounded_to(dxrw, dt), 0, 0, "layernorm dx + dres in " + name);
  cpu_backend().add(dresw, dxw, sumw);
  check_close(dxrw, to_double(sumw), 0, 0, "layernorm dx + dres in f32: dx, then add");

  const std::vector<std::int32_t> pos = {0, 9, 4095};
  Tensor q = random_tensor({3, 4 * 16}, r).to(dt);
  Tensor qw = q.to(dtype::f32);
  emulated::launch(&cuda::rope_kernel<T>, {2, 1, 64, 0}, as<T>(q), pos.data(), std::int64_t{3}, 4, 16, 10000.0, 1.0f);
  emulated::launch(&cuda::rope_kernel<float>, {2, 1, 64, 0}, f(qw), pos.data(), std::int64_t{3}, 4, 16, 10000.0,
                   1.0f);
  check_close(widened(q), rounded_to(qw, dt), 0, 0, "rope in " + name);

  const std::int64_t vocab = 300;
  const std::vector<std::int32_t> targets = {3, -1, 299};
  Tensor logits = random_tensor({3, vocab}, r, -4.0f, 4.0f).to(dt);
  Tensor lw = logits.to(dtype::f32), losses = Tensor::empty({3}), lossesw = Tensor::empty({3});
  emulated::launch(&cuda::cross_entropy_kernel<T>, rows_of(3, cuda::ce_threads), as<T>(logits), targets.data(),
                   f(losses), as<T>(logits), 0.5f, vocab);
  emulated::launch(&cuda::cross_entropy_kernel<float>, rows_of(3, cuda::ce_threads), f(lw), targets.data(),
                   f(lossesw), f(lw), 0.5f, vocab);
  check_close(losses, to_double(lossesw), 0, 0, "cross-entropy losses in " + name);
  check_close(widened(logits), rounded_to(lw, dt), 0, 0, "cross-entropy dlogits in " + name);
}

}  // namespace

TEST_CASE("emulated norm, RoPE and cross-entropy kernels in bf16 and f16 storage are the f32 kernels rounded once") {
  kernel_test::rng r(947);
  check_16bit<__nv_bfloat16>(dtype::bf16, r);
  check_16bit<__half>(dtype::f16, r);
}
