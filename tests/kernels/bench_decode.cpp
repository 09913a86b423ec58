// tests/kernels/bench_decode.cpp — decode-path speed of the CPU backend.
//
// Not a test: it only runs when COROLLA_KERNEL_BENCH is set, e.g.
//   COROLLA_KERNEL_BENCH=1 ./build/tests/test_kernels -tc="decode path*" -s
// and prints figures; without the variable the case returns at once.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

namespace {

bool bench_enabled() { return std::getenv("COROLLA_KERNEL_BENCH") != nullptr; }

/// Seconds per call of f, best of 5 rounds of `reps` calls.
template <class F>
double seconds_per_call(int reps, F&& f) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f(i);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s / reps);
  }
  return best;
}

/// Host read bandwidth (GB/s) over a buffer far larger than any cache.
double read_bandwidth() {
  Tensor big = filled({64 * 1024 * 1024}, 1.0f);  // 256 MiB
  volatile double sink = 0.0;
  double s = seconds_per_call(2, [&](int) { sink = sink + cpu_backend().sum_squares(big); });
  return double(big.nbytes()) / s / 1e9;
}

}  // namespace

TEST_CASE("decode path speed (runs only with COROLLA_KERNEL_BENCH set)") {
  if (!bench_enabled()) return;
  Backend& be = cpu_backend();
  rng r(40);
  std::printf("threads %d, read bandwidth (sum_squares over 256 MiB) %.1f GB/s\n", cpu_threads(),
              read_bandwidth());

  struct shape {
    std::int64_t out, in;
  };
  for (shape s : {shape{4096, 1024}, shape{1024, 4096}}) {
    // 8 distinct weights (128 MiB) cycled, so each call streams its weight
    // from memory as decode does; plus the same weight repeated (cache-hot).
    std::vector<Tensor> ws;
    for (int i = 0; i < 8; ++i) ws.push_back(random_tensor({s.out, s.in}, r));
    Tensor x = random_tensor({1, s.in}, r), y = Tensor::empty({1, s.out});
    const double bytes = double(ws[0].nbytes());
    double cold = seconds_per_call(64, [&](int i) { be.linear(x, ws[i % 8], nullptr, y); });
    double hot = seconds_per_call(64, [&](int) { be.linear(x, ws[0], nullptr, y); });
    std::printf("linear 1 x [%lld x %lld]: %.1f us = %.1f GB/s streamed, %.1f us = %.1f GB/s hot\n",
                (long long)s.out, (long long)s.in, cold * 1e6, bytes / cold / 1e9, hot * 1e6,
                bytes / hot / 1e9);
  }

  for (int hkv : {8, 2}) {
    const int hq = 8, dh = 128, L = 512;
    const std::int64_t page_tokens = 16, kw = hkv * dh;
    std::vector<Tensor> pages_k, pages_v;
    std::vector<const void*> kp, vp;
    for (int p = 0; p < L / page_tokens; ++p) {
      pages_k.push_back(random_tensor({page_tokens, kw}, r));
      pages_v.push_back(random_tensor({page_tokens, kw}, r));
      kp.push_back(pages_k.back().data<float>());
      vp.push_back(pages_v.back().data<float>());
    }
    kv_pages_view cache{kp, vp, page_tokens, L};
    Tensor q = random_tensor({1, hq * dh}, r), out = Tensor::empty({1, hq * dh});
    const attention_shape as{hq, hkv, dh, 0.0f};
    double t = seconds_per_call(200, [&](int) { be.attention_cached(q, cache, L - 1, as, out); });
    const double kv_bytes = 2.0 * L * kw * sizeof(float);
    std::printf("attention_cached Hq=%d Hkv=%d Dh=%d L=%d: %.1f us (%.1f GB/s of K/V)\n", hq, hkv,
                dh, L, t * 1e6, kv_bytes / t / 1e9);
  }

  // One decode step of the issue's ~100M Llama shape (dim 1024, 8 layers,
  // 8 heads of 128, MLP 2816, vocab 4096) with the cache at 512 tokens:
  // every op in the order a block runs them, to see them together.
  {
    const int layers = 8, hq = 8, hkv = 8, dh = 128, L = 512;
    const std::int64_t d = 1024, f = 2816, vocab = 4096, page_tokens = 16;
    struct block_weights {
      Tensor norm1, wq, wk, wv, wo, norm2, wg, wu, wd;
      std::vector<Tensor> k_pages, v_pages;
      std::vector<const void*> kp, vp;
    };
    std::vector<block_weights> blocks(layers);
    double weight_bytes = 0.0;
    for (auto& b : blocks) {
      b.norm1 = random_tensor({d}, r);
      b.norm2 = random_tensor({d}, r);
      b.wq = random_tensor({hq * dh, d}, r, -0.03f, 0.03f);
      b.wk = random_tensor({hkv * dh, d}, r, -0.03f, 0.03f);
      b.wv = random_tensor({hkv * dh, d}, r, -0.03f, 0.03f);
      b.wo = random_tensor({d, hq * dh}, r, -0.03f, 0.03f);
      b.wg = random_tensor({f, d}, r, -0.03f, 0.03f);
      b.wu = random_tensor({f, d}, r, -0.03f, 0.03f);
      b.wd = random_tensor({d, f}, r, -0.02f, 0.02f);
      for (Tensor* w : {&b.wq, &b.wk, &b.wv, &b.wo, &b.wg, &b.wu, &b.wd})
        weight_bytes += double(w->nbytes());
      for (int p = 0; p < L / page_tokens; ++p) {
        b.k_pages.push_back(random_tensor({page_tokens, hkv * dh}, r));
        b.v_pages.push_back(random_tensor({page_tokens, hkv * dh}, r));
        b.kp.push_back(b.k_pages.back().data<float>());
        b.vp.push_back(b.v_pages.back().data<float>());
      }
    }
    Tensor head = random_tensor({vocab, d}, r, -0.03f, 0.03f);
    weight_bytes += double(head.nbytes());
    Tensor x = random_tensor({1, d}, r), h = Tensor::empty({1, d}), q = Tensor::empty({1, hq * dh}),
           k = Tensor::empty({1, hkv * dh}), v = Tensor::empty({1, hkv * dh}),
           att = Tensor::empty({1, hq * dh}), o = Tensor::empty({1, d}),
           g = Tensor::empty({1, f}), u = Tensor::empty({1, f}), logits = Tensor::empty({1, vocab});
    const std::vector<std::int32_t> pos_value{L - 1};
    Tensor pos = Tensor::from_i32(pos_value, {1});
    const attention_shape as{hq, hkv, dh, 0.0f};
    double t = seconds_per_call(20, [&](int) {
      for (auto& b : blocks) {
        be.rmsnorm(x, b.norm1, 1e-5f, h, nullptr);
        be.linear(h, b.wq, nullptr, q);
        be.linear(h, b.wk, nullptr, k);
        be.linear(h, b.wv, nullptr, v);
        be.rope(q, pos, hq, dh, 10000.0f);
        be.rope(k, pos, hkv, dh, 10000.0f);
        be.attention_cached(q, kv_pages_view{b.kp, b.vp, page_tokens, L}, L - 1, as, att);
        be.linear(att, b.wo, nullptr, o);
        be.add(x, o, x);
        be.rmsnorm(x, b.norm2, 1e-5f, h, nullptr);
        be.linear(h, b.wg, nullptr, g);
        be.linear(h, b.wu, nullptr, u);
        be.swiglu(g, u, g);
        be.linear(g, b.wd, nullptr, o);
        be.add(x, o, x);
      }
      be.linear(x, head, nullptr, logits);
    });
    std::printf("decode step, dim 1024 x 8 layers (%.0f MB weights, cache 512): %.2f ms = %.1f "
                "tokens/s, %.1f GB/s of weights\n",
                weight_bytes / 1e6, t * 1e3, 1.0 / t, weight_bytes / t / 1e9);
  }
}
