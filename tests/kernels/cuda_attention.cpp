// tests/kernels/cuda_attention.cpp — the CUDA backend's attention against
// the CPU reference: the fused decode ops, attention forward and backward
// (MHA, GQA, head sizes), cached attention over device pages, and attention
// in bf16 and f16 storage. Same method and tolerances as cuda_ops.cpp
// (cuda_ops_util.hpp); the tensor-core kernels are in cuda_attention_mma.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernel_test_util.hpp"
#include "tests/support/gpu.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

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

TEST_CASE("cuda: cached attention of a batch of sequences in one launch equals each sequence's own") {
  REQUIRE_GPU_OR_SKIP();
  rng r(117);
  const attention_shape s{8, 2, 128, 0.0f};
  const std::int64_t qw = 8 * 128, kw = 2 * 128, page_tokens = 16;
  // Lengths within one key chunk and across several, as a decode batch has.
  const std::vector<std::int64_t> positions{0, 150, 37, 64, 200};
  const auto n = static_cast<std::int64_t>(positions.size());
  std::vector<std::vector<Tensor>> host(positions.size()), dev(positions.size());
  std::vector<std::vector<const void*>> kd(positions.size()), vd(positions.size()), kh(positions.size()),
      vh(positions.size());
  std::vector<kv_pages_view> gpu_views, cpu_views;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const std::int64_t pages = (positions[i] + 1 + page_tokens - 1) / page_tokens;
    for (std::int64_t p = 0; p < 2 * pages; ++p) {
      host[i].push_back(random_tensor({page_tokens, kw}, r));
      dev[i].push_back(up(host[i].back()));
      (p < pages ? kh[i] : vh[i]).push_back(host[i].back().raw());
      (p < pages ? kd[i] : vd[i]).push_back(dev[i].back().raw());
    }
    gpu_views.push_back(kv_pages_view{kd[i], vd[i], page_tokens, positions[i] + 1});
    cpu_views.push_back(kv_pages_view{kh[i], vh[i], page_tokens, positions[i] + 1});
  }
  const Tensor q = random_tensor({n, qw}, r);
  const Tensor dq = up(q);
  Tensor batch = gpu().empty({n, qw}), single = gpu().empty({n, qw}), want = Tensor::empty({n, qw});
  gpu().attention_cached_batch(dq, gpu_views, positions, s, batch);
  for (std::int64_t i = 0; i < n; ++i) {
    Tensor row = single.slice(i, i + 1), cpu_row = want.slice(i, i + 1);
    gpu().attention_cached(dq.slice(i, i + 1), gpu_views[static_cast<std::size_t>(i)],
                           positions[static_cast<std::size_t>(i)], s, row);
    cpu().attention_cached(q.slice(i, i + 1), cpu_views[static_cast<std::size_t>(i)],
                           positions[static_cast<std::size_t>(i)], s, cpu_row);
  }
  expect_close(batch, down(single), red_rtol, red_atol, "attention_cached_batch vs attention_cached per row");
  expect_close(batch, want, red_rtol, red_atol, "attention_cached_batch vs the cpu");
  // A cache of the host's is refused, as attention_cached refuses it.
  CHECK_THROWS_AS(gpu().attention_cached_batch(dq, cpu_views, positions, s, batch), tensor_error);
}
