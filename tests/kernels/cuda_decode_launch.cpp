// tests/kernels/cuda_decode_launch.cpp — how decode's kernels are launched
// on a GPU: the batch-1 GEMV's launch variants and the tuner that picks
// one per weight shape (kernels/cuda/linear_bf16.hpp), and early launch
// (programmatic dependent launch, kernels/cuda/grid_dependency.cuh).
//
// What must hold: every variant writes the same bits (the tuner's choice
// may not change what decode computes; the emulated test checks the same on
// the CPU), the tuner keeps the variant it timed fastest (unless within 3 %
// of the default), the fused epilogues (Backend::linear_fused) write what
// linear and the op after it write (and linear_rope_store_kv what linear
// and rope_store_kv write), and a chain of decode's ops gives the
// same bits with early launch on and off, fused or not: the GEMV reads the
// previous kernel's output only after waiting for it, so a race would show
// as different bits (if the timing exposes it: run without
// COROLLA_CUDA_SYNC, which serialises every launch). Without a GPU each
// case says why and returns.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/linear_bf16.hpp"
#endif

using namespace corolla;
using namespace kernel_test;

#ifdef COROLLA_HAVE_CUDA
namespace {

/// Puts the process-wide launch settings back as they were.
struct restore_launch_settings {
  bool early = cuda::early_launch_requested();
  ~restore_launch_settings() {
    cuda::set_early_launch(early);
    cuda::set_gemv_variant(-1);
  }
};

}  // namespace
#endif

TEST_CASE("cuda: every batch-1 GEMV variant writes the same bits, and the tuner keeps the fastest") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  restore_launch_settings restore;
  const std::vector<std::string> names = cuda::gemv_variant_names();
  REQUIRE(names.size() >= 2);
  rng r(71);
  struct shape {
    std::int64_t in, out;
  };
  // 4096: whole batches of loads for every variant; 4104 and 1288: a tail.
  for (const shape& c : {shape{4096, 1000}, shape{4104, 37}, shape{1288, 13}}) {
    CAPTURE(c.in);
    const Tensor x = random_tensor({1, c.in}, r);
    const Tensor w = random_tensor({c.out, c.in}, r);
    const Tensor b = random_tensor({c.out}, r);
    Tensor want = Tensor::empty({1, c.out});
    cpu_backend().linear(x, w.to(dtype::bf16), &b, want);
    const Tensor dx = up(x, dtype::f32), dw = up(w, dtype::bf16), db = up(b, dtype::f32);
    Tensor first;
    for (int i = 0; i < static_cast<int>(names.size()); ++i) {
      CAPTURE(names[static_cast<std::size_t>(i)]);
      cuda::set_gemv_variant(i);
      Tensor dy = gpu().empty({1, c.out});
      gpu().linear(dx, dw, &db, dy);
      const Tensor got = down(dy);
      check_close(got, to_double(want), 1e-4, 1e-5, "bf16-weight GEMV " + names[static_cast<std::size_t>(i)]);
      if (i == 0)
        first = got;
      else
        CHECK(same_values(got, first));
    }
  }

  // The tuner: a shape not seen before is timed once, on every variant.
  cuda::set_gemv_variant(-1);
  const std::int64_t in = 2056, out = 77;
  const Tensor x = random_tensor({1, in}, r), w = random_tensor({out, in}, r);
  const Tensor dx = up(x, dtype::f32), dw = up(w, dtype::bf16);
  Tensor dy = gpu().empty({1, out});
  gpu().linear(dx, dw, nullptr, dy);
  const Tensor tuned = down(dy);
  const std::vector<cuda::gemv_choice> seen = cuda::gemv_choices();
  const auto it = std::find_if(seen.begin(), seen.end(), [&](const cuda::gemv_choice& c) {
    return c.device == 0 && c.in == in && c.out == out && c.rows == 1;
  });
  REQUIRE(it != seen.end());
  REQUIRE(it->microseconds.size() == names.size());
  for (double us : it->microseconds) CHECK(us > 0.0);
  // the fastest the tuner may choose, unless it beats the default by less than 3 %
  std::size_t fastest = 0;
  for (std::size_t i = 1; i < names.size(); ++i)
    if (cuda::gemv_variant_tuned(static_cast<int>(i)) && it->microseconds[i] < it->microseconds[fastest]) fastest = i;
  CHECK(cuda::gemv_variant_tuned(it->chosen));
  CHECK(it->chosen == (it->microseconds[fastest] < 0.97 * it->microseconds[0] ? static_cast<int>(fastest) : 0));
  MESSAGE("in " << in << ", out " << out << ": chose " << names[static_cast<std::size_t>(it->chosen)] << " ("
                << it->microseconds[static_cast<std::size_t>(it->chosen)] << " us; default "
                << it->microseconds[0] << " us)");
  cuda::set_gemv_variant(0);
  gpu().linear(dx, dw, nullptr, dy);
  CHECK(same_values(down(dy), tuned));

  CHECK_THROWS_AS(cuda::set_gemv_variant(static_cast<int>(names.size())), std::out_of_range);

  // Several rows (a server's batch): timed once per number of rows among
  // the variants of several rows per pass only, the same bits whichever.
  const std::int64_t rows = 5, in5 = 2064, out5 = 83;
  const Tensor x5 = random_tensor({rows, in5}, r), w5 = random_tensor({out5, in5}, r);
  const Tensor dx5 = up(x5, dtype::f32), dw5 = up(w5, dtype::bf16);
  Tensor dy5 = gpu().empty({rows, out5});
  cuda::set_gemv_variant(-1);
  gpu().linear(dx5, dw5, nullptr, dy5);
  const Tensor tuned5 = down(dy5);
  const std::vector<cuda::gemv_choice> seen5 = cuda::gemv_choices();
  const auto c5 = std::find_if(seen5.begin(), seen5.end(), [&](const cuda::gemv_choice& c) {
    return c.device == 0 && c.in == in5 && c.out == out5 && c.rows == rows;
  });
  REQUIRE(c5 != seen5.end());
  REQUIRE(c5->microseconds.size() == names.size());
  int timed = 0;
  for (double us : c5->microseconds)
    if (!std::isnan(us)) {
      CHECK(us > 0.0);
      ++timed;
    }
  CHECK(timed >= 3);  // the default, r8.u2 and r8.o2 at least
  CHECK(timed < static_cast<int>(names.size()));
  CHECK_FALSE(std::isnan(c5->microseconds[static_cast<std::size_t>(c5->chosen)]));
  MESSAGE(rows << " rows: chose " << names[static_cast<std::size_t>(c5->chosen)]);
  Tensor want5 = Tensor::empty({rows, out5});
  cpu_backend().linear(x5, w5.to(dtype::bf16), nullptr, want5);
  check_close(tuned5, to_double(want5), 1e-4, 1e-5, "several-row GEMV, tuned");
  // Fixed, each variant of several rows per pass runs them (a one-row
  // variant leaves them to the default): the same bits.
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    CAPTURE(names[static_cast<std::size_t>(i)]);
    cuda::set_gemv_variant(i);
    gpu().linear(dx5, dw5, nullptr, dy5);
    CHECK(same_values(down(dy5), tuned5));
  }
#endif
}

TEST_CASE("cuda: linear_fused equals linear then add, gelu or swiglu, bit for bit") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  rng r(73);
  // 11 rows: a second pass over the weight; in = 1030: the scalar kernel.
  for (auto [rows, in] : {std::pair<std::int64_t, std::int64_t>{1, 1032}, {3, 1032}, {11, 1032}, {2, 1030}}) {
    CAPTURE(rows);
    CAPTURE(in);
    const std::int64_t out = 300;
    const Tensor x = up(random_tensor({rows, in}, r), dtype::f32);
    const Tensor w = up(random_tensor({2 * out, in}, r, -0.1f, 0.1f), dtype::bf16);
    const Tensor w_half = w.slice(0, out);
    const Tensor b = up(random_tensor({out}, r), dtype::f32);
    const Tensor res = up(random_tensor({rows, out}, r), dtype::f32);
    Tensor t = gpu().empty({rows, out}), t2 = gpu().empty({rows, 2 * out}), want = gpu().empty({rows, out});
    Tensor got = gpu().empty({rows, out});

    gpu().linear(x, w_half, &b, t);
    gpu().add(res, t, want);
    REQUIRE(gpu().linear_fused(x, w_half, &b, linear_epilogue::add, &res, got));
    CHECK(same_values(down(got), down(want)));
    Tensor in_place = gpu().empty({rows, out});
    gpu().copy(res, in_place);  // the residual may be y itself
    REQUIRE(gpu().linear_fused(x, w_half, &b, linear_epilogue::add, &in_place, in_place));
    CHECK(same_values(down(in_place), down(want)));

    gpu().gelu(t, want);
    REQUIRE(gpu().linear_fused(x, w_half, &b, linear_epilogue::gelu, nullptr, got));
    CHECK(same_values(down(got), down(want)));

    gpu().linear(x, w, nullptr, t2);
    for (std::int64_t row = 0; row < rows; ++row) {
      const Tensor both = t2.slice(row, row + 1).view({2 * out});
      Tensor want_row = want.slice(row, row + 1);
      gpu().swiglu(both.slice(0, out).view({1, out}), both.slice(out, 2 * out).view({1, out}), want_row);
    }
    REQUIRE(gpu().linear_fused(x, w, nullptr, linear_epilogue::swiglu, nullptr, got));
    CHECK(same_values(down(got), down(want)));
  }
  // What it does not take it leaves to the caller, untouched.
  const Tensor x32 = up(random_tensor({1, 64}, r), dtype::f32), w32 = up(random_tensor({64, 64}, r), dtype::f32);
  Tensor y = gpu().empty({1, 64});
  CHECK_FALSE(gpu().linear_fused(x32, w32, nullptr, linear_epilogue::gelu, nullptr, y));
  const Tensor many = up(random_tensor({17, 64}, r), dtype::f32), w16 = up(random_tensor({64, 64}, r), dtype::bf16);
  Tensor y17 = gpu().empty({17, 64});
  CHECK_FALSE(gpu().linear_fused(many, w16, nullptr, linear_epilogue::gelu, nullptr, y17));
  // What it takes with a wrong shape is an error.
  Tensor wrong = gpu().empty({1, 63});
  CHECK_THROWS_AS(gpu().linear_fused(x32.slice(0, 1), w16, nullptr, linear_epilogue::gelu, nullptr, wrong),
                  tensor_error);
#endif
}

TEST_CASE("cuda: linear_rope_store_kv equals linear then rope_store_kv, bit for bit") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  rng r(74);
  struct shape {
    int hq, hkv, head_dim;
    std::int64_t in;
    bool bias, rotate;
  };
  // Llama-3-8B's grouped heads (rotated, no bias); GPT-2-1.5B's (biases, no rotation).
  for (const shape& c : {shape{32, 8, 128, 4096, false, true}, shape{25, 25, 64, 1600, true, false}}) {
    CAPTURE(c.hq);
    CAPTURE(c.in);
    const std::int64_t qw = std::int64_t{c.hq} * c.head_dim, kw = std::int64_t{c.hkv} * c.head_dim;
    const std::int64_t rows_w = qw + 2 * kw;
    const Tensor x = up(random_tensor({1, c.in}, r), dtype::f32);
    const Tensor w = up(random_tensor({rows_w, c.in}, r, -0.05f, 0.05f), dtype::bf16);
    const Tensor b = up(random_tensor({rows_w}, r), dtype::f32);
    const Tensor pos = Tensor::from_i32(std::vector<std::int32_t>{3071}, {1});
    const rope_spec spec(500000.0);
    for (dtype cache : {dtype::f32, dtype::bf16, dtype::f16}) {
      CAPTURE(dtype_name(cache));
      Tensor qkv = gpu().empty({1, rows_w});
      gpu().linear(x, w, c.bias ? &b : nullptr, qkv);
      const Tensor all = qkv.view({rows_w});
      Tensor q = all.slice(0, qw).view({1, qw}), k = all.slice(qw, qw + kw).view({1, kw});
      Tensor want_k = gpu().empty({1, kw}, cache), want_v = gpu().empty({1, kw}, cache);
      gpu().rope_store_kv(q, k, all.slice(qw + kw, rows_w).view({1, kw}), pos, c.hq, c.hkv, c.head_dim, spec,
                          c.rotate, want_k.raw(), want_v.raw(), cache);
      Tensor got_q = gpu().empty({1, qw}), got_k = gpu().empty({1, kw}, cache), got_v = gpu().empty({1, kw}, cache);
      REQUIRE(gpu().linear_rope_store_kv(x, w, c.bias ? &b : nullptr, pos, c.hq, c.hkv, c.head_dim, spec, c.rotate,
                                         got_q, got_k.raw(), got_v.raw(), cache));
      CHECK(same_values(down(got_q), down(q)));
      CHECK(same_values(down(got_k), down(want_k)));
      CHECK(same_values(down(got_v), down(want_v)));
    }
  }
  // An f32 weight is left to the caller.
  const Tensor x = up(random_tensor({1, 64}, r), dtype::f32), w32 = up(random_tensor({3 * 64, 64}, r), dtype::f32);
  Tensor q = gpu().empty({1, 64}), k_row = gpu().empty({1, 64}), v_row = gpu().empty({1, 64});
  CHECK_FALSE(gpu().linear_rope_store_kv(x, w32, nullptr, Tensor::from_i32(std::vector<std::int32_t>{1}, {1}), 1, 1,
                                         64, 10000.0, true, q, k_row.raw(), v_row.raw(), dtype::f32));
#endif
}

TEST_CASE("cuda: early launch changes no bit of a chain of decode's ops") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  restore_launch_settings restore;
  MESSAGE("early launch on this device: " << (cuda::early_launch_active() ? "yes" : "no (before sm_90)"));
  rng r(72);
  const std::int64_t D = 1024, F = 2816;
  const Tensor norm_w = up(random_tensor({D}, r, 0.5f, 1.5f), dtype::f32);
  const Tensor gate_up_w = up(random_tensor({2 * F, D}, r, -0.05f, 0.05f), dtype::bf16);
  const Tensor gate_w = gate_up_w.slice(0, F), up_w = gate_up_w.slice(F, 2 * F);
  const Tensor down_w = up(random_tensor({D, F}, r, -0.05f, 0.05f), dtype::bf16);
  const Tensor x0 = random_tensor({1, D}, r);

  // Forty layers of norm -> GEMVs -> SwiGLU -> GEMV -> residual add, every
  // buffer reused, as decode runs them: unfused, or fused as the model runs
  // them on CUDA (Backend::linear_fused).
  auto run = [&](bool early, bool fused) {
    cuda::set_early_launch(early);
    Tensor h = up(x0, dtype::f32), h2 = gpu().empty({1, D});
    Tensor n = gpu().empty({1, D}), g = gpu().empty({1, F}), u = gpu().empty({1, F});
    Tensor a = gpu().empty({1, F}), t = gpu().empty({1, D});
    for (int layer = 0; layer < 40; ++layer) {
      gpu().rmsnorm(h, norm_w, 1e-5f, n, nullptr);
      if (fused) {
        REQUIRE(gpu().linear_fused(n, gate_up_w, nullptr, linear_epilogue::swiglu, nullptr, a));
        REQUIRE(gpu().linear_fused(a, down_w, nullptr, linear_epilogue::add, &h, h2));
      } else {
        gpu().linear(n, gate_w, nullptr, g);
        gpu().linear(n, up_w, nullptr, u);
        gpu().swiglu(g, u, a);
        gpu().linear(a, down_w, nullptr, t);
        gpu().add(h, t, h2);
      }
      std::swap(h, h2);
    }
    return down(h);
  };
  const Tensor serial = run(false, false);
  for (int repeat = 0; repeat < 3; ++repeat) {
    CHECK(same_values(run(true, false), serial));
    CHECK(same_values(run(true, true), serial));
  }
  CHECK(same_values(run(false, true), serial));
#endif
}
