// tests/kernels/hot_path.cpp — the decode hot path allocates nothing, and
// the thread-split BLAS paths (taken only above the serial work limit)
// compute the same products as naive loops.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

// ---- allocation counting -------------------------------------------------------
// This executable replaces the global operator new to count heap
// allocations while `g_counting` is set. The backend's only heap use is C++
// (vectors, shared_ptr, strings), so this sees all of it.
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

// GCC cannot see that this operator new and delete pair up malloc and free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("decode-path ops allocate nothing once warmed up") {
  Backend& be = cpu_backend();
  const int saved = cpu_threads();
  set_cpu_threads(2);  // exercise the parallel paths too
  rng r(50);
  const int hq = 8, hkv = 2, dh = 64, L = 100;
  const std::int64_t d = 512, f = 1024, vocab = 300, page_tokens = 16;
  Tensor x = random_tensor({1, d}, r), w = random_tensor({f, d}, r), bias = random_tensor({f}, r),
         norm_w = random_tensor({d}, r), norm_b = random_tensor({d}, r),
         table = random_tensor({vocab, d}, r);
  Tensor h = Tensor::empty({1, d}), g = Tensor::empty({1, f}), u = Tensor::empty({1, f}),
         q = random_tensor({1, hq * dh}, r), att = Tensor::empty({1, hq * dh});
  std::vector<Tensor> pages;
  std::vector<const void*> kp, vp;
  for (std::int64_t p = 0; p * page_tokens < L; ++p) {
    pages.push_back(random_tensor({page_tokens, hkv * dh}, r));
    kp.push_back(pages.back().data<float>());
    vp.push_back(pages.back().data<float>());
  }
  const std::vector<std::int32_t> pos_value{L - 1}, id_value{7};
  Tensor pos = Tensor::from_i32(pos_value, {1}), ids = Tensor::from_i32(id_value, {1});
  const attention_shape s{hq, hkv, dh, 0.0f};

  auto step = [&] {
    be.embedding(ids, table, h);
    be.rmsnorm(x, norm_w, 1e-5f, h, nullptr);
    be.layernorm(x, norm_w, norm_b, 1e-5f, h, nullptr, nullptr);
    be.linear(h, w, nullptr, g);
    be.linear(h, w, &bias, u);
    be.rope(q, pos, hq, dh, 12345.0f);  // a theta no other test uses: its table is built here
    be.attention_cached(q, kv_pages_view{kp, vp, page_tokens, L}, L - 1, s, att);
    be.swiglu(g, u, g);
    be.gelu(u, u);
    be.add(x, h, x);
  };
  // warm-up: per-thread scratch grows, the rope table is built (which also
  // shows the counter sees the backend's allocations)
  g_counting = true;
  step();
  g_counting = false;
  const long warm_up = g_allocations.exchange(0);
  g_counting = true;
  for (int i = 0; i < 3; ++i) step();
  g_counting = false;
  set_cpu_threads(saved);
  CHECK(warm_up > 0);
  CHECK(g_allocations.load() == 0);
}

TEST_CASE("products split over threads match naive loops") {
  Backend& be = cpu_backend();
  const int saved = cpu_threads();
  set_cpu_threads(2);
  rng r(51);
  struct dims {
    std::int64_t m, n, k;
  };
  // m >= n splits rows, m < n splits columns, m = 1 splits the gemv; all
  // above the serial work limit
  for (dims dm : {dims{70, 24, 50}, dims{20, 90, 40}, dims{1, 300, 200}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(dm.m);
        CAPTURE(ta);
        CAPTURE(tb);
        Tensor a = random_tensor(ta ? shape_t{dm.k, dm.m} : shape_t{dm.m, dm.k}, r);
        Tensor b = random_tensor(tb ? shape_t{dm.n, dm.k} : shape_t{dm.k, dm.n}, r);
        Tensor c = random_tensor({dm.m, dm.n}, r);
        auto av = to_double(a), bv = to_double(b), cv = to_double(c);
        std::vector<double> want(static_cast<std::size_t>(dm.m * dm.n));
        for (std::int64_t i = 0; i < dm.m; ++i)
          for (std::int64_t j = 0; j < dm.n; ++j) {
            double acc = 0.0;
            for (std::int64_t p = 0; p < dm.k; ++p)
              acc += (ta ? av[p * dm.m + i] : av[i * dm.k + p]) *
                     (tb ? bv[j * dm.k + p] : bv[p * dm.n + j]);
            want[i * dm.n + j] = 1.5 * acc - 0.5 * cv[i * dm.n + j];
          }
        be.gemm(a, ta, b, tb, c, 1.5f, -0.5f);
        check_close(c, want, 1e-4, 1e-4, "gemm");
      }

  // single-row linear backward: dx through the column-split gemv, dw through
  // the row-split rank-1 update
  const std::int64_t in = 300, out = 200;
  Tensor x = random_tensor({1, in}, r), w = random_tensor({out, in}, r),
         dy = random_tensor({1, out}, r);
  Tensor dx = filled({1, in}, std::nanf("")), dw = filled({out, in}, 1.0f);
  be.linear_backward(x, w, dy, &dx, dw, nullptr);
  set_cpu_threads(saved);
  auto xv = to_double(x), wv = to_double(w), dyv = to_double(dy);
  std::vector<double> want_dx(in, 0.0), want_dw(static_cast<std::size_t>(out * in));
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) {
      want_dx[i] += dyv[o] * wv[o * in + i];
      want_dw[o * in + i] = 1.0 + dyv[o] * xv[i];
    }
  check_close(dx, want_dx, 1e-4, 1e-4, "dx");
  check_close(dw, want_dw, 1e-5, 1e-6, "dw");
}
