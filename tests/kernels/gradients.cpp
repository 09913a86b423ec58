// tests/kernels/gradients.cpp — every backward pass of the CPU backend
// against central finite differences of the f32 forward.
//
// Each test builds L = sum(out .* R) for a fixed random R, so dL/dout = R is
// what the backward receives. Activation gradients are pre-filled with NaN
// (they must be overwritten); parameter gradients start at a non-zero
// constant (they must be accumulated into).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

namespace {

constexpr double grad_rtol = 1e-2;
constexpr double grad_atol = 1e-3;
const float nan_f = std::nanf("");

}  // namespace

TEST_CASE("linear backward matches finite differences for dx, dw and db") {
  Backend& be = cpu_backend();
  for (std::int64_t rows : {1, 4}) {  // 1 row takes the gemv / rank-1 paths
    CAPTURE(rows);
    const std::int64_t in = 8, out = 6;
    rng r(11);
    Tensor x = random_tensor({rows, in}, r), w = random_tensor({out, in}, r),
           b = random_tensor({out}, r), weights = random_tensor({rows, out}, r);
    Tensor y = Tensor::empty({rows, out});
    auto loss = [&] {
      be.linear(x, w, &b, y);
      return weighted_sum(y, weights);
    };
    Tensor dx = filled({rows, in}, nan_f), dw = filled({out, in}, 0.5f), db = filled({out}, 0.25f);
    be.linear_backward(x, w, weights, &dx, dw, &db);
    check_close(dx, numeric_grad(x, loss), grad_rtol, grad_atol, "dx");
    check_close(minus(dw, 0.5), numeric_grad(w, loss), grad_rtol, grad_atol, "dw");
    check_close(minus(db, 0.25), numeric_grad(b, loss), grad_rtol, grad_atol, "db");
  }
}

TEST_CASE("embedding backward accumulates repeated ids like finite differences") {
  Backend& be = cpu_backend();
  rng r(12);
  const std::vector<std::int32_t> id_values{2, 0, 2, 4};
  Tensor ids = Tensor::from_i32(id_values, {4});
  Tensor table = random_tensor({5, 8}, r), weights = random_tensor({4, 8}, r);
  Tensor out = Tensor::empty({4, 8});
  auto loss = [&] {
    be.embedding(ids, table, out);
    return weighted_sum(out, weights);
  };
  Tensor dtable = filled({5, 8}, 1.0f);
  be.embedding_backward(ids, weights, dtable);
  check_close(minus(dtable, 1.0), numeric_grad(table, loss), grad_rtol, grad_atol, "dtable");
}

TEST_CASE("rmsnorm backward matches finite differences") {
  Backend& be = cpu_backend();
  rng r(13);
  const std::int64_t n = 3, d = 16;
  Tensor x = random_tensor({n, d}, r), w = random_tensor({d}, r, 0.5f, 1.5f),
         weights = random_tensor({n, d}, r);
  Tensor y = Tensor::empty({n, d}), rstd = Tensor::empty({n});
  auto loss = [&] {
    be.rmsnorm(x, w, 1e-5f, y, nullptr);
    return weighted_sum(y, weights);
  };
  be.rmsnorm(x, w, 1e-5f, y, &rstd);
  Tensor dx = filled({n, d}, nan_f), dw = filled({d}, 0.5f);
  be.rmsnorm_backward(x, w, rstd, weights, dx, dw);
  check_close(dx, numeric_grad(x, loss), grad_rtol, grad_atol, "dx");
  check_close(minus(dw, 0.5), numeric_grad(w, loss), grad_rtol, grad_atol, "dw");
}

TEST_CASE("layernorm backward matches finite differences") {
  Backend& be = cpu_backend();
  rng r(14);
  const std::int64_t n = 4, d = 12;
  Tensor x = random_tensor({n, d}, r, -1.0f, 2.0f), w = random_tensor({d}, r, 0.5f, 1.5f),
         b = random_tensor({d}, r), weights = random_tensor({n, d}, r);
  Tensor y = Tensor::empty({n, d}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  auto loss = [&] {
    be.layernorm(x, w, b, 1e-5f, y, nullptr, nullptr);
    return weighted_sum(y, weights);
  };
  be.layernorm(x, w, b, 1e-5f, y, &mean, &rstd);
  Tensor dx = filled({n, d}, nan_f), dw = filled({d}, 0.5f), db = filled({d}, -0.5f);
  be.layernorm_backward(x, w, mean, rstd, weights, dx, dw, db);
  check_close(dx, numeric_grad(x, loss), grad_rtol, grad_atol, "dx");
  check_close(minus(dw, 0.5), numeric_grad(w, loss), grad_rtol, grad_atol, "dw");
  check_close(minus(db, -0.5), numeric_grad(b, loss), grad_rtol, grad_atol, "db");
}

TEST_CASE("rope backward (inverse rotation) matches finite differences") {
  Backend& be = cpu_backend();
  rng r(15);
  const int heads = 2, head_dim = 8;
  const std::int64_t n = 5, width = heads * head_dim;
  const std::vector<std::int32_t> pos_values{0, 3, 7, 1, 100};
  Tensor pos = Tensor::from_i32(pos_values, {n});
  Tensor x = random_tensor({n, width}, r), weights = random_tensor({n, width}, r);
  Tensor work = Tensor::empty({n, width});
  auto loss = [&] {
    work.copy_from(x);
    be.rope(work, pos, heads, head_dim, 10000.0f);
    return weighted_sum(work, weights);
  };
  Tensor dx = weights.clone();
  be.rope(dx, pos, heads, head_dim, 10000.0f, /*inverse=*/true);
  check_close(dx, numeric_grad(x, loss), grad_rtol, grad_atol, "dx");
}

TEST_CASE("attention backward matches finite differences for MHA and GQA") {
  Backend& be = cpu_backend();
  struct heads_case {
    int hq, hkv;
  };
  for (heads_case hc : {heads_case{2, 2}, heads_case{4, 2}}) {
    CAPTURE(hc.hq);
    CAPTURE(hc.hkv);
    const int batch = 2, seq = 5, dh = 8;
    const attention_shape s{hc.hq, hc.hkv, dh, 0.0f};
    const std::int64_t rows = batch * seq, qw = hc.hq * dh, kw = hc.hkv * dh;
    rng r(16);
    Tensor q = random_tensor({rows, qw}, r), k = random_tensor({rows, kw}, r),
           v = random_tensor({rows, kw}, r), weights = random_tensor({rows, qw}, r);
    Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({batch * hc.hq * seq});
    auto loss = [&] {
      be.attention(q, k, v, batch, seq, s, out, nullptr);
      return weighted_sum(out, weights);
    };
    be.attention(q, k, v, batch, seq, s, out, &lse);
    Tensor dq = filled({rows, qw}, nan_f), dk = filled({rows, kw}, nan_f),
           dv = filled({rows, kw}, nan_f);
    be.attention_backward(q, k, v, out, lse, weights, batch, seq, s, dq, dk, dv);
    check_close(dq, numeric_grad(q, loss), grad_rtol, grad_atol, "dq");
    check_close(dk, numeric_grad(k, loss), grad_rtol, grad_atol, "dk");
    check_close(dv, numeric_grad(v, loss), grad_rtol, grad_atol, "dv");
  }
}

TEST_CASE("attention backward with an explicit scale matches finite differences") {
  Backend& be = cpu_backend();
  const int batch = 1, seq = 4, dh = 8;
  const attention_shape s{2, 1, dh, 0.7f};
  rng r(17);
  Tensor q = random_tensor({seq, 2 * dh}, r), k = random_tensor({seq, dh}, r),
         v = random_tensor({seq, dh}, r), weights = random_tensor({seq, 2 * dh}, r);
  Tensor out = Tensor::empty({seq, 2 * dh}), lse = Tensor::empty({2 * seq});
  auto loss = [&] {
    be.attention(q, k, v, batch, seq, s, out, nullptr);
    return weighted_sum(out, weights);
  };
  be.attention(q, k, v, batch, seq, s, out, &lse);
  Tensor dq = filled({seq, 2 * dh}, nan_f), dk = filled({seq, dh}, nan_f),
         dv = filled({seq, dh}, nan_f);
  be.attention_backward(q, k, v, out, lse, weights, batch, seq, s, dq, dk, dv);
  check_close(dq, numeric_grad(q, loss), grad_rtol, grad_atol, "dq");
  check_close(dk, numeric_grad(k, loss), grad_rtol, grad_atol, "dk");
  check_close(dv, numeric_grad(v, loss), grad_rtol, grad_atol, "dv");
}

TEST_CASE("attention backward across two query tiles matches finite differences") {
  Backend& be = cpu_backend();
  const int batch = 1, seq = 70, dh = 4;  // tiles of 64 and 6 rows
  const attention_shape s{2, 1, dh, 0.0f};
  const std::int64_t qw = 2 * dh, kw = dh;
  rng r(21);
  Tensor q = random_tensor({seq, qw}, r, -2.0f, 2.0f), k = random_tensor({seq, kw}, r, -2.0f, 2.0f),
         v = random_tensor({seq, kw}, r), weights = random_tensor({seq, qw}, r);
  Tensor out = Tensor::empty({seq, qw}), lse = Tensor::empty({2 * seq});
  auto loss = [&] {
    be.attention(q, k, v, batch, seq, s, out, nullptr);
    return weighted_sum(out, weights);
  };
  be.attention(q, k, v, batch, seq, s, out, &lse);
  Tensor dq = filled({seq, qw}, nan_f), dk = filled({seq, kw}, nan_f), dv = filled({seq, kw}, nan_f);
  be.attention_backward(q, k, v, out, lse, weights, batch, seq, s, dq, dk, dv);
  check_close(dq, numeric_grad(q, loss), grad_rtol, grad_atol, "dq");
  check_close(dk, numeric_grad(k, loss), grad_rtol, grad_atol, "dk");
  check_close(dv, numeric_grad(v, loss), grad_rtol, grad_atol, "dv");
}

TEST_CASE("swiglu backward matches finite differences") {
  Backend& be = cpu_backend();
  rng r(18);
  Tensor gate = random_tensor({3, 16}, r, -3.0f, 3.0f), up = random_tensor({3, 16}, r),
         weights = random_tensor({3, 16}, r);
  Tensor out = Tensor::empty({3, 16});
  auto loss = [&] {
    be.swiglu(gate, up, out);
    return weighted_sum(out, weights);
  };
  Tensor dgate = filled({3, 16}, nan_f), dup = filled({3, 16}, nan_f);
  be.swiglu_backward(gate, up, weights, dgate, dup);
  check_close(dgate, numeric_grad(gate, loss), grad_rtol, grad_atol, "dgate");
  check_close(dup, numeric_grad(up, loss), grad_rtol, grad_atol, "dup");
}

TEST_CASE("gelu backward matches finite differences") {
  Backend& be = cpu_backend();
  rng r(19);
  Tensor x = random_tensor({3, 16}, r, -4.0f, 4.0f), weights = random_tensor({3, 16}, r);
  Tensor y = Tensor::empty({3, 16});
  auto loss = [&] {
    be.gelu(x, y);
    return weighted_sum(y, weights);
  };
  Tensor dx = filled({3, 16}, nan_f);
  be.gelu_backward(x, weights, dx);
  check_close(dx, numeric_grad(x, loss), grad_rtol, grad_atol, "dx");
}

TEST_CASE("cross-entropy gradient is the derivative of the mean loss") {
  Backend& be = cpu_backend();
  rng r(20);
  const std::int64_t n = 4, vocab = 10;
  const std::vector<std::int32_t> target_values{3, -1, 0, 9};
  Tensor targets = Tensor::from_i32(target_values, {n});
  Tensor logits = random_tensor({n, vocab}, r, -3.0f, 3.0f);
  Tensor losses = Tensor::empty({n});
  auto mean_loss = [&] {
    be.cross_entropy(logits, targets, losses, nullptr, 0.0f);
    double s = 0.0;
    for (float l : losses.to_vector()) s += l;
    return s / double(n);
  };
  Tensor dlogits = filled({n, vocab}, nan_f);
  be.cross_entropy(logits, targets, losses, &dlogits, 1.0f / float(n));
  check_close(dlogits, numeric_grad(logits, mean_loss), grad_rtol, grad_atol, "dlogits");
  // the ignored row has a zero gradient, exactly
  for (float g : dlogits.slice(1, 2).to_vector()) CHECK(g == 0.0f);
}
