// tests/kernels/linear_same_x.cpp — Backend::linear_same_x and its backward
// (products of one input: a training block's q, k and v). On the CPU (the
// Backend's default) they are one linear (linear_backward, gemm) per
// product, bit for bit; on CUDA (kernels/cuda/gemm_same_x.cpp) weights laid
// out as a GPT-2 block's are (each followed by its bias, so equally spaced)
// with outputs that are slices of one buffer run as one strided batched
// cuBLASLt product, checked against the CPU per product, in f32 and bf16;
// unequally spaced operands take the per-product path there and agree too;
// grouped-query attention's k and v (q wider) batch without q, and two
// products without biases (Llama's gate and up) batch too. The layout
// rule (kernels/same_x_batch.hpp) is checked on the CPU.
// Without the CUDA backend or a visible device the GPU test says why in a
// MESSAGE and returns.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/same_x_batch.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

namespace {

/// More rows than decode's 16; an output width that leaves a weight and its
/// bias 11640 elements long, so the bf16 weights are 16-byte aligned only.
constexpr std::int64_t rows = 64, in = 96, out = 120, products = 3;
/// Where each product's weight starts in the flat parameters: after 8
/// leading elements (a norm's), then weight, bias, weight, bias, ...
constexpr std::int64_t lead = 8, step = out * in + out;

/// The three weights and biases as views of `flat` ([lead + 3 * step]).
struct laid_out {
  std::vector<Tensor> w, b;
};
laid_out views_of(const Tensor& flat) {
  laid_out l;
  for (std::int64_t i = 0; i < products; ++i) {
    const std::int64_t at = lead + i * step;
    l.w.push_back(flat.slice(at, at + out * in).view({out, in}));
    l.b.push_back(flat.slice(at + out * in, at + step));
  }
  return l;
}

template <class T>
std::vector<T*> pointers(std::vector<Tensor>& ts) {
  std::vector<T*> p;
  for (Tensor& t : ts) p.push_back(&t);
  return p;
}

/// Rows [i * rows, (i + 1) * rows) of `stack` for each product.
std::vector<Tensor> slices_of(const Tensor& stack) {
  std::vector<Tensor> s;
  for (std::int64_t i = 0; i < products; ++i) s.push_back(stack.slice(i * rows, (i + 1) * rows));
  return s;
}

/// Batched products the CUDA backend has run so far (0 without it).
int batched() {
#ifdef COROLLA_HAVE_CUDA
  return static_cast<const cuda::cuda_backend&>(gpu()).batched_products();
#else
  return 0;
#endif
}

double out_rtol(dtype t) { return t == dtype::f32 ? red_rtol : 1e-2; }
double out_atol(dtype t) { return t == dtype::f32 ? red_atol : 1e-2; }

}  // namespace

TEST_CASE("linear_same_x and its backward are one linear (linear_backward, gemm) per product on the cpu") {
  rng r(431);
  Backend& be = cpu();
  const Tensor flat = random_tensor({lead + products * step}, r);
  laid_out p = views_of(flat);
  const Tensor x = random_tensor({rows, in}, r);
  const std::vector<const Tensor*> ws = pointers<const Tensor>(p.w), bs = pointers<const Tensor>(p.b);

  Tensor stack = Tensor::empty({products * rows, out});
  std::vector<Tensor> ys = slices_of(stack);
  be.linear_same_x(x, ws, bs, pointers<Tensor>(ys));
  for (std::int64_t i = 0; i < products; ++i) {
    Tensor want = Tensor::empty({rows, out});
    be.linear(x, p.w[i], &p.b[i], want);
    CHECK(to_double(ys[i]) == to_double(want));
  }

  const Tensor dstack = random_tensor({products * rows, out}, r);
  std::vector<Tensor> dys = slices_of(dstack);
  const Tensor grads0 = random_tensor({lead + products * step}, r);
  Tensor grads = grads0.clone(), grads_want = grads0.clone();
  laid_out g = views_of(grads), g_want = views_of(grads_want);
  Tensor dx = random_tensor({rows, in}, r), dx_want = Tensor::empty({rows, in});
  be.linear_same_x_backward(x, ws, pointers<const Tensor>(dys), &dx, pointers<Tensor>(g.w), pointers<Tensor>(g.b));
  for (std::int64_t i = 0; i < products; ++i) {
    be.linear_backward(x, p.w[i], dys[i], i == 0 ? &dx_want : nullptr, g_want.w[i], &g_want.b[i]);
    if (i > 0) be.gemm(dys[i], false, p.w[i], false, dx_want, 1.0f, 1.0f);
  }
  CHECK(to_double(dx) == to_double(dx_want));
  CHECK(to_double(grads) == to_double(grads_want));

  // Counts that do not pair up are refused before anything runs.
  const std::vector<const Tensor*> two(ws.begin(), ws.begin() + 2);
  const std::string e = error_of([&] { be.linear_same_x(x, two, bs, pointers<Tensor>(ys)); });
  CHECK(e.find("linear_same_x: 2 weights, 3 outputs and 3 biases") != std::string::npos);
}

TEST_CASE("the layout one batched product needs: evenly spaced, disjoint outputs, all biases or none") {
  rng r(437);
  const Tensor flat = random_tensor({lead + products * step}, r);
  laid_out p = views_of(flat);
  const Tensor x = random_tensor({rows, in}, r);
  Tensor stack = Tensor::empty({4 * rows, out});
  std::vector<Tensor> ys = slices_of(stack);
  const std::vector<const Tensor*> ws = pointers<const Tensor>(p.w), bs = pointers<const Tensor>(p.b);
  const std::vector<Tensor*> yp = pointers<Tensor>(ys);

  const auto batch = linear_same_x_batch(x, ws, bs, yp);
  REQUIRE(batch.has_value());
  CHECK(batch->weights == step);
  CHECK(batch->biases == step);
  CHECK(batch->outputs == rows * out);
  const std::vector<const Tensor*> none(products, nullptr);
  CHECK(linear_same_x_batch(x, ws, none, yp)->biases == 0);
  CHECK(linear_same_x_batch(x, ws, {}, yp).has_value());

  // Not one batch: a bias missing, outputs unevenly spaced or overlapping,
  // a weight out of line, a null weight, a single product, another dtype.
  const std::vector<const Tensor*> two_biases = {bs[0], bs[1], nullptr};
  CHECK_FALSE(linear_same_x_batch(x, ws, two_biases, yp).has_value());
  Tensor later = stack.slice(3 * rows, 4 * rows);
  CHECK_FALSE(linear_same_x_batch(x, ws, bs, std::vector<Tensor*>{yp[0], yp[1], &later}).has_value());
  Tensor overlapping[] = {stack.slice(0, rows), stack.slice(1, rows + 1), stack.slice(2, rows + 2)};
  const std::vector<Tensor*> overlap = {&overlapping[0], &overlapping[1], &overlapping[2]};
  CHECK_FALSE(linear_same_x_batch(x, ws, bs, overlap).has_value());
  const std::vector<const Tensor*> swapped = {ws[0], ws[2], ws[1]}, with_null = {ws[0], nullptr, ws[2]};
  CHECK_FALSE(linear_same_x_batch(x, swapped, bs, yp).has_value());
  CHECK_FALSE(linear_same_x_batch(x, with_null, bs, yp).has_value());
  const std::vector<const Tensor*> one = {ws[0]};
  CHECK_FALSE(linear_same_x_batch(x, one, {}, std::vector<Tensor*>{yp[0]}).has_value());
  const Tensor x16 = x.to(dtype::bf16);
  CHECK_FALSE(linear_same_x_batch(x16, ws, bs, yp).has_value());  // weights of another dtype than x
  CHECK_FALSE(even_spacing(std::vector<const Tensor*>{ws[0], ws[0]}, false).has_value());  // no distance

  // The backward: output gradients evenly spaced, weight gradients too and disjoint.
  const std::vector<const Tensor*> dys = {yp[0], yp[1], yp[2]};
  Tensor grads = flat.clone();
  laid_out g = views_of(grads);
  const auto back = linear_same_x_backward_batch(x, ws, dys, pointers<Tensor>(g.w), pointers<Tensor>(g.b));
  REQUIRE(back.has_value());
  CHECK(back->weights == step);
  CHECK(back->outputs == rows * out);
  CHECK_FALSE(linear_same_x_backward_batch(x, ws, std::vector<const Tensor*>{yp[0], yp[1], &later},
                                          pointers<Tensor>(g.w), pointers<Tensor>(g.b))
                  .has_value());
}

namespace {

/// Grouped-query attention's layout, as a Llama/Qwen2 block's flat
/// parameters have it: the q, k and v weights one after another (q twice
/// as wide as k and v), then their biases.
constexpr std::int64_t gqa_q = 2 * out;
constexpr std::int64_t gqa_size = lead + (gqa_q + 2 * out) * in + gqa_q + 2 * out;

struct gqa_views {
  std::vector<Tensor> w, b;
};
gqa_views gqa_views_of(const Tensor& flat) {
  gqa_views v;
  std::int64_t at = lead;
  for (const std::int64_t width : {gqa_q, out, out}) {
    v.w.push_back(flat.slice(at, at + width * in).view({width, in}));
    at += width * in;
  }
  for (const std::int64_t width : {gqa_q, out, out}) {
    v.b.push_back(flat.slice(at, at + width));
    at += width;
  }
  return v;
}

}  // namespace

TEST_CASE("grouped-query attention's q, k and v: k and v batch, q alone") {
  rng r(439);
  const Tensor flat = random_tensor({gqa_size}, r);
  gqa_views p = gqa_views_of(flat);
  const Tensor x = random_tensor({rows, in}, r);
  Tensor q = Tensor::empty({rows, gqa_q}), kv = Tensor::empty({2 * rows, out});
  Tensor k = kv.slice(0, rows), v = kv.slice(rows, 2 * rows);
  const std::vector<const Tensor*> ws = pointers<const Tensor>(p.w), bs = pointers<const Tensor>(p.b);
  const std::vector<Tensor*> ys = {&q, &k, &v};
  CHECK_FALSE(linear_same_x_batch(x, ws, bs, ys).has_value());  // q's width differs
  const auto plan = linear_same_x_plan(x, ws, bs, ys);
  REQUIRE(plan.has_value());
  CHECK(plan->first == 1);
  CHECK(plan->strides.weights == out * in);
  CHECK(plan->strides.biases == out);
  CHECK(plan->strides.outputs == rows * out);
  Tensor grads = flat.clone();
  gqa_views g = gqa_views_of(grads);
  const std::vector<const Tensor*> dys = {&q, &k, &v};
  const auto back = linear_same_x_backward_plan(x, ws, dys, pointers<Tensor>(g.w), pointers<Tensor>(g.b));
  REQUIRE(back.has_value());
  CHECK(back->first == 1);
  CHECK(back->strides.weights == out * in);
  // v's output before k's in memory: nothing batches; nor does a pair
  // whose first differs (the rule leaves out the first of three or more).
  Tensor k2 = kv.slice(rows, 2 * rows), v2 = kv.slice(0, rows);
  CHECK_FALSE(linear_same_x_plan(x, ws, bs, std::vector<Tensor*>{&q, &k2, &v2}).has_value());
  const std::vector<const Tensor*> kv_w = {ws[1], ws[2]}, q_k = {ws[0], ws[1]};
  CHECK(linear_same_x_plan(x, kv_w, {}, std::vector<Tensor*>{&k, &v})->first == 0);
  CHECK_FALSE(linear_same_x_plan(x, q_k, {}, std::vector<Tensor*>{&q, &k}).has_value());
  // The MHA layout: all three, from the first.
  laid_out m = views_of(random_tensor({lead + products * step}, r));
  Tensor stack = Tensor::empty({products * rows, out});
  std::vector<Tensor> mys = slices_of(stack);
  CHECK(linear_same_x_plan(x, pointers<const Tensor>(m.w), pointers<const Tensor>(m.b), pointers<Tensor>(mys))
            ->first == 0);
}

TEST_CASE("cuda: grouped-query attention's k and v as one batched product, q alone, match the cpu (f32, bf16)") {
  REQUIRE_GPU_OR_SKIP();
  rng r(441);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const std::string type_name = dtype_name(t);
    CAPTURE(type_name);
    const Tensor flat = rounded(random_tensor({gqa_size}, r), t);
    const Tensor x = rounded(random_tensor({rows, in}, r), t);
    const Tensor dflat = up(flat, t), dxin = up(x, t);
    gqa_views p = gqa_views_of(flat), dp = gqa_views_of(dflat);
    const std::vector<const Tensor*> ws = pointers<const Tensor>(dp.w), bs = pointers<const Tensor>(dp.b);
    Tensor q = gpu().empty({rows, gqa_q}, t), kv = gpu().empty({2 * rows, out}, t);
    Tensor k = kv.slice(0, rows), v = kv.slice(rows, 2 * rows);
    const int before = batched();
    gpu().linear_same_x(dxin, ws, bs, std::vector<Tensor*>{&q, &k, &v});
    CHECK(batched() == before + 1);
    const Tensor* got[] = {&q, &k, &v};
    for (std::size_t i = 0; i < 3; ++i) {
      Tensor want = Tensor::empty({rows, p.w[i].dim(0)});
      cpu().linear(x, p.w[i], &p.b[i], want);
      expect_close(*got[i], want, out_rtol(t), out_atol(t), "y " + std::to_string(i));
    }

    // Backward into random flat gradients (a second micro-batch's).
    const Tensor dq = rounded(random_tensor({rows, gqa_q}, r, -0.25f, 0.25f), t);
    const Tensor dkv = rounded(random_tensor({2 * rows, out}, r, -0.25f, 0.25f), t);
    const Tensor ddq = up(dq, t), ddkv = up(dkv, t);
    const Tensor ddk = ddkv.slice(0, rows), ddv = ddkv.slice(rows, 2 * rows);
    const Tensor dk = dkv.slice(0, rows), dv = dkv.slice(rows, 2 * rows);
    const Tensor grads0 = rounded(random_tensor({gqa_size}, r), t);
    Tensor grads_want = grads0.clone(), dgrads = up(grads0, t);
    gqa_views g_want = gqa_views_of(grads_want), dg = gqa_views_of(dgrads);
    Tensor dx_want = Tensor::empty({rows, in}), ddx = up(random_tensor({rows, in}, r), t);
    const int before_backward = batched();
    gpu().linear_same_x_backward(dxin, ws, std::vector<const Tensor*>{&ddq, &ddk, &ddv}, &ddx,
                                 pointers<Tensor>(dg.w), pointers<Tensor>(dg.b));
    CHECK(batched() == before_backward + 1);
    const Tensor* dys[] = {&dq, &dk, &dv};
    for (std::size_t i = 0; i < 3; ++i) {
      cpu().linear_backward(x, p.w[i], *dys[i], i == 0 ? &dx_want : nullptr, g_want.w[i], &g_want.b[i]);
      if (i > 0) cpu().gemm(*dys[i], false, p.w[i], false, dx_want, 1.0f, 1.0f);
    }
    expect_close(ddx, dx_want, out_rtol(t), t == dtype::f32 ? grad_atol : 5e-2, "dx");
    expect_close(dgrads, grads_want, t == dtype::f32 ? grad_rtol : 1e-2, t == dtype::f32 ? grad_atol : 2e-2,
                 "dw and db in the flat gradients");
  }
}

TEST_CASE("cuda: linear_same_x and its backward as one batched product match the cpu per product (f32, bf16)") {
  REQUIRE_GPU_OR_SKIP();
  rng r(433);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const std::string type_name = dtype_name(t);
    CAPTURE(type_name);
    const Tensor flat = rounded(random_tensor({lead + products * step}, r), t);
    const Tensor x = rounded(random_tensor({rows, in}, r), t);
    const Tensor dflat = up(flat, t), dxin = up(x, t);
    laid_out p = views_of(flat), dp = views_of(dflat);

    // Forward, batched (equally spaced weights, biases and outputs) and per
    // product (outputs of separate allocations), against the cpu.
    Tensor stack = gpu().empty({products * rows, out}, t), uneven = gpu().empty({4 * rows, out}, t);
    std::vector<Tensor> ys = slices_of(stack), apart = slices_of(uneven);
    apart[2] = uneven.slice(3 * rows, 4 * rows);  // rows 0, 1 and 3: not evenly spaced
    const std::vector<const Tensor*> ws = pointers<const Tensor>(dp.w), bs = pointers<const Tensor>(dp.b);
    const int before = batched();
    gpu().linear_same_x(dxin, ws, bs, pointers<Tensor>(ys));
    CHECK(batched() == before + 1);  // one batch (the heuristic has an algorithm for it)
    gpu().linear_same_x(dxin, ws, bs, pointers<Tensor>(apart));
    CHECK(batched() == before + 1);  // one product each
    for (std::int64_t i = 0; i < products; ++i) {
      Tensor want = Tensor::empty({rows, out});
      cpu().linear(x, p.w[i], &p.b[i], want);
      expect_close(ys[i], want, out_rtol(t), out_atol(t), "batched y " + std::to_string(i));
      expect_close(apart[i], want, out_rtol(t), out_atol(t), "per-product y " + std::to_string(i));
    }
    // Without biases.
    const std::vector<const Tensor*> none(products, nullptr);
    gpu().linear_same_x(dxin, ws, none, pointers<Tensor>(ys));
    Tensor want_nb = Tensor::empty({rows, out});
    cpu().linear(x, p.w[2], nullptr, want_nb);
    expect_close(ys[2], want_nb, out_rtol(t), out_atol(t), "batched y, no bias");

    // Backward: dx overwritten, dw and db accumulated into the flat
    // gradients (random to start with, as a second micro-batch finds them).
    const Tensor dstack = rounded(random_tensor({products * rows, out}, r, -0.25f, 0.25f), t);
    const Tensor ddstack = up(dstack, t);
    std::vector<Tensor> dys = slices_of(dstack), ddys = slices_of(ddstack);
    const Tensor grads0 = rounded(random_tensor({lead + products * step}, r), t);
    Tensor grads_want = grads0.clone(), dgrads = up(grads0, t);
    laid_out g_want = views_of(grads_want), dg = views_of(dgrads);
    Tensor dx_want = Tensor::empty({rows, in}), ddx = up(random_tensor({rows, in}, r), t);
    const int before_backward = batched();
    gpu().linear_same_x_backward(dxin, ws, pointers<const Tensor>(ddys), &ddx, pointers<Tensor>(dg.w),
                                 pointers<Tensor>(dg.b));
    CHECK(batched() == before_backward + 1);
    for (std::int64_t i = 0; i < products; ++i) {
      cpu().linear_backward(x, p.w[i], dys[i], i == 0 ? &dx_want : nullptr, g_want.w[i], &g_want.b[i]);
      if (i > 0) cpu().gemm(dys[i], false, p.w[i], false, dx_want, 1.0f, 1.0f);
    }
    // (bf16: dx is rounded after each of its three products)
    expect_close(ddx, dx_want, out_rtol(t), t == dtype::f32 ? grad_atol : 5e-2, "dx");
    expect_close(dgrads, grads_want, t == dtype::f32 ? grad_rtol : 1e-2, t == dtype::f32 ? grad_atol : 2e-2,
                 "dw and db in the flat gradients");
  }
}

namespace {

/// Llama's gate and up as a block's flat parameters have them: two weights
/// of one shape, one after the other, no biases.
constexpr std::int64_t pair_size = lead + 2 * out * in;
std::vector<Tensor> pair_of(const Tensor& flat) {
  return {flat.slice(lead, lead + out * in).view({out, in}), flat.slice(lead + out * in, pair_size).view({out, in})};
}

}  // namespace

TEST_CASE("cuda: two products without biases (Llama's gate and up) as one batch, and their backward, match the cpu (f32, bf16)") {
  REQUIRE_GPU_OR_SKIP();
  rng r(443);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const std::string type_name = dtype_name(t);
    CAPTURE(type_name);
    const Tensor flat = rounded(random_tensor({pair_size}, r), t);
    const Tensor x = rounded(random_tensor({rows, in}, r), t);
    const Tensor dflat = up(flat, t), dxin = up(x, t);
    std::vector<Tensor> p = pair_of(flat), dp = pair_of(dflat);
    const std::vector<const Tensor*> ws = pointers<const Tensor>(dp);
    Tensor stack = gpu().empty({2 * rows, out}, t);
    Tensor gate = stack.slice(0, rows), upp = stack.slice(rows, 2 * rows);
    const int before = batched();
    gpu().linear_same_x(dxin, ws, {}, std::vector<Tensor*>{&gate, &upp});
    CHECK(batched() == before + 1);
    const Tensor* got[] = {&gate, &upp};
    for (std::size_t i = 0; i < 2; ++i) {
      Tensor want = Tensor::empty({rows, out});
      cpu().linear(x, p[i], nullptr, want);
      expect_close(*got[i], want, out_rtol(t), out_atol(t), "y " + std::to_string(i));
    }

    // Backward: dx overwritten, the weight gradients accumulated into the
    // flat gradients, no bias gradients.
    const Tensor dstack = rounded(random_tensor({2 * rows, out}, r, -0.25f, 0.25f), t);
    const Tensor ddstack = up(dstack, t);
    const Tensor dys[] = {dstack.slice(0, rows), dstack.slice(rows, 2 * rows)};
    const Tensor ddys[] = {ddstack.slice(0, rows), ddstack.slice(rows, 2 * rows)};
    const Tensor grads0 = rounded(random_tensor({pair_size}, r), t);
    Tensor grads_want = grads0.clone(), dgrads = up(grads0, t);
    std::vector<Tensor> g_want = pair_of(grads_want), dg = pair_of(dgrads);
    Tensor dx_want = Tensor::empty({rows, in}), ddx = up(random_tensor({rows, in}, r), t);
    const int before_backward = batched();
    gpu().linear_same_x_backward(dxin, ws, std::vector<const Tensor*>{&ddys[0], &ddys[1]}, &ddx,
                                 pointers<Tensor>(dg), {});
    CHECK(batched() == before_backward + 1);
    cpu().linear_backward(x, p[0], dys[0], &dx_want, g_want[0], nullptr);
    cpu().linear_backward(x, p[1], dys[1], nullptr, g_want[1], nullptr);
    cpu().gemm(dys[1], false, p[1], false, dx_want, 1.0f, 1.0f);
    expect_close(ddx, dx_want, out_rtol(t), t == dtype::f32 ? grad_atol : 5e-2, "dx");
    expect_close(dgrads, grads_want, t == dtype::f32 ? grad_rtol : 1e-2, t == dtype::f32 ? grad_atol : 2e-2,
                 "dw in the flat gradients");
    // The lead elements before the weights are untouched.
    expect_close(dgrads.slice(0, lead), grads0.slice(0, lead), 0.0, 0.0, "elements before the weights");
  }
}
