// tests/kernels/cuda_ops.cpp — the CUDA backend's ops against the CPU
// reference: embeddings, normalisation and parameter gradients, rope,
// activations and elementwise ops (f32 and 16-bit storage), loss, optimiser
// and int8 quantisation. GEMM and linear are in cuda_products.cpp,
// attention in cuda_attention.cpp; transfers, device memory, errors and
// NCCL in cuda_devices.cpp.
//
// Every op runs on both backends with the same seeded inputs (copied to the
// device with Backend::copy) and the outputs, backward outputs included, are
// compared element-wise. Without the CUDA backend or a visible device each
// GPU test says why in a MESSAGE and returns. The tolerances are explained
// in cuda_ops_util.hpp.
#include <doctest/doctest.h>

#include <cmath>
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

TEST_CASE("cuda: parameter gradients over many rows (chunked column sums) match the cpu and repeat bit for bit") {
  // linear's db and the norms' dw/db are column sums over chunks of 256
  // rows (kernels/cuda/column_sums.hpp): one chunk, two (the second of one
  // row) and four; 100 columns, the last of four column tiles partial.
  REQUIRE_GPU_OR_SKIP();
  rng r(131);
  const std::int64_t d = 100, out = 40;
  for (std::int64_t rows : {256, 257, 1000}) {
    CAPTURE(rows);
    for (dtype t : {dtype::f32, dtype::bf16}) {
      CAPTURE(dtype_name(t));
      const Tensor x = rounded(random_tensor({rows, d}, r, -2.0f, 3.0f), t), w = rounded(random_tensor({out, d}, r), t),
                   g = rounded(random_tensor({rows, out}, r), t), gn = rounded(random_tensor({rows, d}, r), t);
      const Tensor dw0 = random_tensor({out, d}, r), db0 = random_tensor({out}, r);
      Tensor dw = dw0.clone(), db = db0.clone();
      cpu().linear_backward(x, w, g, nullptr, dw, &db);
      Tensor first;
      for (int run = 0; run < 2; ++run) {
        Tensor ddw = up(dw0), ddb = up(db0);
        gpu().linear_backward(up(x, t), up(w, t), up(g, t), nullptr, ddw, &ddb);
        expect_close(ddb, db, grad_rtol, grad_atol, "linear_backward db (accumulated)");
        expect_close(ddw, dw, grad_rtol, grad_atol, "linear_backward dw (accumulated)");
        if (run == 0)
          first = down(ddb);
        else
          CHECK(same_values(down(ddb), first));
      }

      const Tensor nw = random_tensor({d}, r, 0.5f, 1.5f), nb = random_tensor({d}, r);
      Tensor y = Tensor::empty({rows, d}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
      Tensor dx = Tensor::empty({rows, d}), ndw = random_tensor({d}, r), ndb = random_tensor({d}, r);
      const Tensor ndw0 = ndw.clone(), ndb0 = ndb.clone();
      cpu().rmsnorm(x, nw, 1e-5f, y, &rstd);
      cpu().rmsnorm_backward(x, nw, rstd, gn, dx, ndw);
      Tensor gdx = gpu().empty({rows, d}, t), gdw = up(ndw0);
      gpu().rmsnorm_backward(up(x, t), up(nw), up(rstd), up(gn, t), gdx, gdw);
      expect_close(gdw, ndw, grad_rtol, grad_atol, "rmsnorm dw (accumulated)");
      ndw = ndw0.clone();
      cpu().layernorm(x, nw, nb, 1e-5f, y, &mean, &rstd);
      cpu().layernorm_backward(x, nw, mean, rstd, gn, dx, ndw, ndb);
      gdw = up(ndw0);
      Tensor gdb = up(ndb0);
      gpu().layernorm_backward(up(x, t), up(nw), up(mean), up(rstd), up(gn, t), gdx, gdw, gdb);
      expect_close(gdw, ndw, grad_rtol, grad_atol, "layernorm dw (accumulated)");
      expect_close(gdb, ndb, grad_rtol, grad_atol, "layernorm db (accumulated)");
      Tensor gdw2 = up(ndw0), gdb2 = up(ndb0);  // again: the same bits
      gpu().layernorm_backward(up(x, t), up(nw), up(mean), up(rstd), up(gn, t), gdx, gdw2, gdb2);
      CHECK(same_values(down(gdw2), down(gdw)));
      CHECK(same_values(down(gdb2), down(gdb)));
    }
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
  // adamw_with_copy: the same update, and the copy its parameters rounded
  // once, bit for bit the update followed by a conversion.
  const Tensor g = up(random_tensor({n}, r));
  Tensor p2 = up(down(dp)), m2 = up(down(dm)), v2 = up(down(dv));
  gpu().adamw(dp, g, dm, dv, hp, 4);
  // The state step 4 leaves (dp, dm, dv), bit for bit.
  const auto expect_step4 = [&](const Tensor& p4, const Tensor& m4, const Tensor& v4) {
    CHECK(same_values(down(p4), down(dp)));
    CHECK(same_values(down(m4), down(dm)));
    CHECK(same_values(down(v4), down(dv)));
  };
  for (const dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    Tensor p3 = up(down(p2)), m3 = up(down(m2)), v3 = up(down(v2)), copy = gpu().empty({n}, t), want = gpu().empty({n}, t);
    gpu().adamw_with_copy(p3, g, m3, v3, hp, 4, copy);
    gpu().copy(dp, want);
    expect_step4(p3, m3, v3);
    CHECK(same_values(down(copy), down(want)));
  }
  // Views one element in (a data-parallel shard's start): three parameters
  // one a thread, the rest four a thread from the 16-byte boundary; then
  // gradients two elements in (no common alignment: one a thread
  // throughout). The same bits as the four-a-thread kernel on the aligned
  // buffers.
  const auto offset_copy = [&](const Tensor& src, std::int64_t offset) {  // src in a new buffer, `offset` in
    Tensor view = gpu().empty({n + offset}).slice(offset, n + offset);
    gpu().copy(src, view);
    return view;
  };
  Tensor off_p = offset_copy(p2, 1), off_m = offset_copy(m2, 1), off_v = offset_copy(v2, 1);
  gpu().adamw(off_p, offset_copy(g, 1), off_m, off_v, hp, 4);
  expect_step4(off_p, off_m, off_v);
  off_p = offset_copy(p2, 1), off_m = offset_copy(m2, 1), off_v = offset_copy(v2, 1);
  Tensor off_copy = gpu().empty({n}, dtype::bf16), want_copy = gpu().empty({n}, dtype::bf16);
  gpu().adamw_with_copy(off_p, offset_copy(g, 2), off_m, off_v, hp, 4, off_copy);
  gpu().copy(dp, want_copy);
  expect_step4(off_p, off_m, off_v);
  CHECK(same_values(down(off_copy), down(want_copy)));
  Tensor f32_copy = gpu().empty({n});
  CHECK_THROWS_AS(gpu().adamw_with_copy(p2, g, m2, v2, hp, 4, f32_copy), tensor_error);
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
