// kernels/cuda/gemm_same_x.cpp — Backend::linear_same_x and its backward
// on CUDA: products of one input (a training block's q, k and v; a Llama
// block's gate and up) as one strided batched cuBLASLt product where their
// operands allow it.
//
// Why: GPT-2-1.5B's q, k and v products at batch 4 are each [4096 x 1600]
// by [1600 x 1600], some 26 us on an H100 or H200, and their weight
// gradients [1600 x 1600] over 4096 rows: each is one to two waves of
// output tiles, so every product pays its own partial last wave and its
// own launch. As one batched product (cuBLASLt's batch count, with x's
// stride 0) they fill the machine three times over.
//
// When (kernels/same_x_batch.hpp): the weights (forward) or the output
// gradients and the weight gradients (backward) are each of one shape and
// dtype and start at equal distances in memory; with grouped-query
// attention (q wider than k and v) k and v batch, q runs alone. A block's
// q, k and v weights are (they follow each other in its flat parameters,
// with a bias between them in GPT-2, also equally spaced), and so are their
// gradients; the model allocates q, k and v and their gradients as slices
// of one buffer (model/block.cpp; with GQA k and v). Else, and for
// inference weights (bf16 with an f32 x: the GEMV), a bias of another
// dtype than y's, empty products,
// biases whose stride would misalign the later ones, a heuristic with no
// batched algorithm (lt_matmul declines both), or
// COROLLA_CUDA_BATCHED_LINEAR=0 (the A/B), the Backend default runs:
// linear, or linear_backward and gemm, one product each.
// The backward's dx stays a sum of one product per weight (its K would be
// the three outputs' widths, which are not adjacent in a row).
#include <cstdint>
#include <optional>
#include <span>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/op_checks.hpp"
#include "kernels/same_x_batch.hpp"

namespace corolla::cuda {
namespace {

bool batching_enabled() {
  static const bool enabled = env_switch("COROLLA_CUDA_BATCHED_LINEAR", true);
  return enabled;
}

/// The operands of product i as the batched path takes them: x [rows, in]
/// and w [out, in] of one float dtype on `where`, y [rows, out] f32 or that
/// dtype, a bias [out] of y's dtype; throws tensor_error naming `op` else.
void check_product(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, device where,
                   const char* op) {
  require_on(x, where, x.type(), op);
  require_condition(x.rank() == 2, op, "expected a 2-D [rows, in] x");
  require_on(w, where, x.type(), {w.dim(0), x.dim(1)}, op);
  require_on(y, where, y.type(), {x.dim(0), w.dim(0)}, op);
  require_product_types(x, "x", w, "w", y, "y");
  if (bias) require_on(*bias, where, y.type(), {w.dim(0)}, op);
}

}  // namespace

void cuda_backend::linear_same_x(const Tensor& x, std::span<const Tensor* const> ws,
                                 std::span<const Tensor* const> bs, std::span<Tensor* const> ys) {
  const std::optional<same_x_batch> plan = linear_same_x_plan(x, ws, bs, ys);
  if (!batching_enabled() || !plan) return Backend::linear_same_x(x, ws, bs, ys);
  // Products [f, n) as one batch; those before it (GQA's q) one each.
  const std::size_t f = plan->first;
  // The products before the batch first (their own checks before anything
  // of the batch runs; should the batch decline, the default writes them
  // again).
  for (std::size_t i = 0; i < f; ++i) linear(x, *ws[i], bs.empty() ? nullptr : bs[i], *ys[i]);
  const auto bws = ws.subspan(f);
  const auto bbs = bs.empty() ? bs : bs.subspan(f);
  const auto bys = ys.subspan(f);
  const bool biased = plan->strides.biases != 0;  // a stride: biases given
  for (std::size_t i = 0; i < bws.size(); ++i)
    check_product(x, *bws[i], biased ? bbs[i] : nullptr, *bys[i], dev(), "linear_same_x");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = bws[0]->dim(0);
  device_guard guard(index_);
  lt_extra e = bias_epilogue(biased ? bbs[0]->raw() : nullptr);
  e.batch = static_cast<int>(bws.size());
  e.batch_b = plan->strides.weights;
  e.batch_c = plan->strides.outputs;
  e.batch_bias = plan->strides.biases;
  e.may_decline = true;
  const Tensor& w = *bws[0];
  Tensor& y = *bys[0];
  if (!lt_matmul(false, true, rows, out, in, 1.0f, x.raw(), x.type(), in, w.raw(), w.type(), in, 0.0f, y.raw(),
                 y.type(), out, e))
    return Backend::linear_same_x(x, ws, bs, ys);  // no batched algorithm: nothing was done
  ++batched_products_;
}

void cuda_backend::linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws,
                                          std::span<const Tensor* const> dys, Tensor* dx,
                                          std::span<Tensor* const> dws, std::span<Tensor* const> dbs) {
  const std::optional<same_x_batch> plan = linear_same_x_backward_plan(x, ws, dys, dws, dbs);
  if (!batching_enabled() || !plan) return Backend::linear_same_x_backward(x, ws, dys, dx, dws, dbs);
  // Each product's operands as linear_backward checks them (dw as the
  // output of dy^T @ x, dx of dy @ w), before anything runs.
  for (std::size_t i = 0; i < ws.size(); ++i) {
    refuse_inference_weight(*ws[i], x.type(), "linear_same_x_backward w");
    check_product(x, *ws[i], nullptr, *dys[i], dev(), "linear_same_x_backward");
    require_on(*dws[i], dev(), dws[i]->type(), {ws[i]->dim(0), x.dim(1)}, "linear_same_x_backward dw");
    require_product_types(*dys[i], "dy", x, "x", *dws[i], "dw");
    if (dx) {
      require_on(*dx, dev(), dx->type(), {x.dim(0), x.dim(1)}, "linear_same_x_backward dx");
      require_product_types(*dys[i], "dy", *ws[i], "w", *dx, "dx");
    }
    if (!dbs.empty() && dbs[i]) {
      require_condition(is_float_dtype(dbs[i]->type()), "linear_same_x_backward db", "expected a float tensor");
      require_on(*dbs[i], dev(), dbs[i]->type(), {ws[i]->dim(0)}, "linear_same_x_backward db");
    }
  }
  // Weight gradients [f, n) as one batch; those before it (GQA's q) one
  // each, after it.
  const std::size_t f = plan->first;
  const std::int64_t rows = x.dim(0), in = x.dim(1);
  device_guard guard(index_);
  // dw_i[out, in] += dy_i^T[out, rows] @ x[rows, in], all i >= f in one product.
  lt_extra e;
  e.batch = static_cast<int>(ws.size() - f);
  e.batch_a = plan->strides.outputs;
  e.batch_c = plan->strides.weights;
  e.may_decline = true;
  const Tensor& dy = *dys[f];
  Tensor& dw = *dws[f];
  const std::int64_t out = ws[f]->dim(0);
  if (!lt_matmul(true, false, out, in, rows, 1.0f, dy.raw(), dy.type(), out, x.raw(), x.type(), in, 1.0f, dw.raw(),
                 dw.type(), in, e))
    return Backend::linear_same_x_backward(x, ws, dys, dx, dws, dbs);  // no batched algorithm: nothing was done
  ++batched_products_;
  for (std::size_t i = 0; i < f; ++i) linear_backward(x, *ws[i], *dys[i], nullptr, *dws[i], nullptr);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    if (dx) gemm(*dys[i], false, *ws[i], false, *dx, 1.0f, i == 0 ? 0.0f : 1.0f);  // dx (+)= dy_i @ w_i
    if (!dbs.empty() && dbs[i]) {
      const std::int64_t out_i = ws[i]->dim(0);
      column_sum_accumulate(stream_, dys[i]->raw(), elem_of(dys[i]->type(), "linear_same_x_backward dy"), rows,
                            out_i, dbs[i]->raw(), elem_of(dbs[i]->type(), "linear_same_x_backward db"),
                            column_partials(rows, out_i, 1));
    }
  }
}

}  // namespace corolla::cuda
