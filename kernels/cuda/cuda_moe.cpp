// kernels/cuda/cuda_moe.cpp — the CUDA backend's mixture-of-experts row
// moves: the CPU backend's argument checks (kernels/cpu/cpu_moe.cpp), the
// indices checked on the host (uploaded when they live there, as the
// router's always do), then one launcher each (kernels/cuda/moe.hpp). Rows
// are f32, or bf16 / f16 under mixed precision (all of an op's rows the
// same dtype); routing weights and their gradient stay f32.
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {
namespace {

const float* cf(const Tensor* t) { return t ? static_cast<const float*>(t->raw()) : nullptr; }
float* mf(Tensor& t) { return static_cast<float*>(t.raw()); }

/// The storage type of a row tensor on `where` (f32, bf16 or f16).
elem rows_elem(const Tensor& t, device where, const char* what) {
  require_on_device(t, where, what);
  return elem_of(t.type(), what);
}

}  // namespace

void cuda_backend::moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) {
  const elem t = rows_elem(src, dev(), "moe_gather src");
  require_condition(src.rank() == 2, "moe_gather src", "expected a 2-D [N, D] tensor");
  if (!rows.defined()) throw tensor_error("moe_gather rows: tensor is undefined");
  require_condition(rows.rank() == 1, "moe_gather rows", "expected a 1-D [M] tensor");
  const std::int64_t n = src.dim(0), d = src.dim(1), m = rows.dim(0);
  require_on(out, dev(), src.type(), {m, d}, "moe_gather out");
  if (weights) require_on(*weights, dev(), dtype::f32, {m}, "moe_gather weights");
  device_guard guard(index_);
  const index_view r = indices(rows, m, slot_indices, "moe_gather rows");
  require_indices(r.host, m, n, "moe_gather rows");
  cuda::moe_gather(stream_, t, src.raw(), r.dev, cf(weights), out.raw(), m, d);
}

void cuda_backend::moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                               Tensor& out) {
  const elem t = rows_elem(src, dev(), "moe_combine src");
  require_condition(src.rank() == 2, "moe_combine src", "expected a 2-D [M, D] tensor");
  if (!slots.defined()) throw tensor_error("moe_combine slots: tensor is undefined");
  require_condition(slots.rank() == 2, "moe_combine slots", "expected a 2-D [N, K] tensor");
  const std::int64_t m = src.dim(0), d = src.dim(1), n = slots.dim(0), k = slots.dim(1);
  require_on(out, dev(), src.type(), {n, d}, "moe_combine out");
  require_condition(out.raw() != src.raw(), "moe_combine out", "must not alias src");
  if (weights) require_on(*weights, dev(), dtype::f32, {n, k}, "moe_combine weights");
  device_guard guard(index_);
  const index_view s = indices(slots.view({n * k}), n * k, slot_indices, "moe_combine slots");
  require_indices(s.host, n * k, m, "moe_combine slots");
  cuda::moe_combine(stream_, t, src.raw(), s.dev, cf(weights), out.raw(), n, k, d, accumulate);
}

void cuda_backend::moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots,
                                           Tensor& dweights) {
  const elem t = rows_elem(src, dev(), "moe_combine_weight_grad src");
  require_condition(src.rank() == 2, "moe_combine_weight_grad src", "expected a 2-D [M, D] tensor");
  if (!slots.defined()) throw tensor_error("moe_combine_weight_grad slots: tensor is undefined");
  require_condition(slots.rank() == 2, "moe_combine_weight_grad slots", "expected a 2-D [N, K] tensor");
  const std::int64_t m = src.dim(0), d = src.dim(1), n = slots.dim(0), k = slots.dim(1);
  require_on(dy, dev(), src.type(), {n, d}, "moe_combine_weight_grad dy");
  require_on(dweights, dev(), dtype::f32, {n, k}, "moe_combine_weight_grad dweights");
  device_guard guard(index_);
  const index_view s = indices(slots.view({n * k}), n * k, slot_indices, "moe_combine_weight_grad slots");
  require_indices(s.host, n * k, m, "moe_combine_weight_grad slots");
  cuda::moe_combine_weight_grad(stream_, t, dy.raw(), src.raw(), s.dev, mf(dweights), n, k, d);
}

}  // namespace corolla::cuda
