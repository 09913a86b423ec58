// kernels/cpu/cpu_moe.cpp — moving a mixture-of-experts MLP's rows to and
// from its experts (Backend::moe_gather, moe_combine,
// moe_combine_weight_grad).
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cpu {
namespace {

/// The [N,K] slots of moe_combine and its weight gradient, checked against M rows.
const std::int32_t* slots_of(const Tensor& slots, std::int64_t m, const char* what) {
  require_host(slots, dtype::i32, what);
  require_that(slots.rank() == 2, what, "expected a 2-D [N, K] tensor");
  const std::int32_t* s = slots.data<std::int32_t>();
  require_indices(s, slots.numel(), m, what);  // before any parallel loop (nothing may throw inside one)
  return s;
}

}  // namespace

void cpu_backend_impl::moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) {
  require_host(src, dtype::f32, "moe_gather src");
  require_that(src.rank() == 2, "moe_gather src", "expected a 2-D [N, D] tensor");
  require_host(rows, dtype::i32, "moe_gather rows");
  require_that(rows.rank() == 1, "moe_gather rows", "expected a 1-D [M] tensor");
  const std::int64_t n = src.dim(0), d = src.dim(1), m = rows.dim(0);
  require(out, dtype::f32, {m, d}, "moe_gather out");
  if (weights) require(*weights, dtype::f32, {m}, "moe_gather weights");
  const std::int32_t* r = rows.data<std::int32_t>();
  require_indices(r, m, n, "moe_gather rows");
  const float* sp = src.data<float>();
  const float* wp = weights ? weights->data<float>() : nullptr;
  float* op = out.data<float>();
  parallel_for(m, d, [&](std::int64_t i) {
    const float* s = sp + static_cast<std::int64_t>(r[i]) * d;
    float* o = op + i * d;
    const float w = wp ? wp[i] : 1.0f;
#pragma omp simd
    for (std::int64_t c = 0; c < d; ++c) o[c] = s[c] * w;
  });
}

void cpu_backend_impl::moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                                   Tensor& out) {
  require_host(src, dtype::f32, "moe_combine src");
  require_that(src.rank() == 2, "moe_combine src", "expected a 2-D [M, D] tensor");
  const std::int64_t m = src.dim(0), d = src.dim(1);
  const std::int32_t* s = slots_of(slots, m, "moe_combine slots");
  const std::int64_t n = slots.dim(0), k = slots.dim(1);
  require(out, dtype::f32, {n, d}, "moe_combine out");
  require_that(out.raw() != src.raw(), "moe_combine out", "must not alias src");
  if (weights) require(*weights, dtype::f32, {n, k}, "moe_combine weights");
  const float* sp = src.data<float>();
  const float* wp = weights ? weights->data<float>() : nullptr;
  float* op = out.data<float>();
  parallel_for(n, k * d, [&](std::int64_t t) {
    float* o = op + t * d;
    if (!accumulate)
      for (std::int64_t c = 0; c < d; ++c) o[c] = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      const float* r = sp + static_cast<std::int64_t>(s[t * k + j]) * d;
      const float w = wp ? wp[t * k + j] : 1.0f;
#pragma omp simd
      for (std::int64_t c = 0; c < d; ++c) o[c] += w * r[c];
    }
  });
}

void cpu_backend_impl::moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots,
                                               Tensor& dweights) {
  require_host(src, dtype::f32, "moe_combine_weight_grad src");
  require_that(src.rank() == 2, "moe_combine_weight_grad src", "expected a 2-D [M, D] tensor");
  const std::int64_t m = src.dim(0), d = src.dim(1);
  const std::int32_t* s = slots_of(slots, m, "moe_combine_weight_grad slots");
  const std::int64_t n = slots.dim(0), k = slots.dim(1);
  require(dy, dtype::f32, {n, d}, "moe_combine_weight_grad dy");
  require(dweights, dtype::f32, {n, k}, "moe_combine_weight_grad dweights");
  const float* gp = dy.data<float>();
  const float* sp = src.data<float>();
  float* wp = dweights.data<float>();
  parallel_for(n, k * d, [&](std::int64_t t) {
    const float* g = gp + t * d;
    for (std::int64_t j = 0; j < k; ++j) {
      const float* r = sp + static_cast<std::int64_t>(s[t * k + j]) * d;
      double acc = 0;
      for (std::int64_t c = 0; c < d; ++c) acc += static_cast<double>(g[c]) * r[c];
      wp[t * k + j] = static_cast<float>(acc);
    }
  });
}

}  // namespace corolla::cpu
