// kernels/cpu/cpu_norm.cpp — RMSNorm (Llama) and LayerNorm (GPT-2), forward
// and backward. Rows are independent in the forward and for dx; the weight
// (and bias) gradients sum over rows, so a second pass splits the columns
// among threads instead (no races, same summation order for any thread
// count).
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {
namespace {

void check_rows(const Tensor& x, const char* what) {
  require_host(x, dtype::f32, what);
  require_that(x.rank() == 2, what, "expected a 2-D [rows, features] tensor");
}

}  // namespace

void cpu_backend_impl::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y,
                               Tensor* rstd) {
  check_rows(x, "rmsnorm x");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require(w, dtype::f32, {d}, "rmsnorm w");
  require(y, dtype::f32, {n, d}, "rmsnorm y");
  if (rstd) require(*rstd, dtype::f32, {n}, "rmsnorm rstd");
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd ? rstd->data<float>() : nullptr;
  parallel_for(n, 3 * d, [&](std::int64_t r) {
    const float* xr = xp + r * d;
    float* yr = yp + r * d;
    const float rs = 1.0f / std::sqrt(dot(xr, xr, d) / static_cast<float>(d) + eps);
#pragma omp simd
    for (std::int64_t i = 0; i < d; ++i) yr[i] = xr[i] * rs * wp[i];
    if (rp) rp[r] = rs;
  });
}

void cpu_backend_impl::rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                                        const Tensor& dy, Tensor& dx, Tensor& dw) {
  check_rows(x, "rmsnorm_backward x");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require(w, dtype::f32, {d}, "rmsnorm_backward w");
  require(rstd, dtype::f32, {n}, "rmsnorm_backward rstd");
  require(dy, dtype::f32, {n, d}, "rmsnorm_backward dy");
  require(dx, dtype::f32, {n, d}, "rmsnorm_backward dx");
  require(dw, dtype::f32, {d}, "rmsnorm_backward dw");
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* rp = rstd.data<float>();
  const float* gp = dy.data<float>();
  float* dxp = dx.data<float>();
  float* dwp = dw.data<float>();

  // dx_j = r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)),  r = rstd
  parallel_for(n, 4 * d, [&](std::int64_t row) {
    const float* xr = xp + row * d;
    const float* g = gp + row * d;
    float* o = dxp + row * d;
    const float* wr = wp;  // a local copy: GCC gathers through captured pointers in simd reductions
    const float r = rp[row];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (std::int64_t i = 0; i < d; ++i) s += wr[i] * g[i] * xr[i];
    const float c = r * r * s / static_cast<float>(d);
#pragma omp simd
    for (std::int64_t i = 0; i < d; ++i) o[i] = r * (wr[i] * g[i] - xr[i] * c);
  });
  // dw_j += sum_rows dy_j x_j r
  parallel_ranges(d, n, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t row = 0; row < n; ++row) {
      const float* xr = xp + row * d;
      const float* g = gp + row * d;
      const float r = rp[row];
#pragma omp simd
      for (std::int64_t c = c0; c < c1; ++c) dwp[c] += g[c] * xr[c] * r;
    }
  });
}

void cpu_backend_impl::layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                 Tensor& y, Tensor* mean, Tensor* rstd) {
  check_rows(x, "layernorm x");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require(w, dtype::f32, {d}, "layernorm w");
  require(b, dtype::f32, {d}, "layernorm b");
  require(y, dtype::f32, {n, d}, "layernorm y");
  if (mean) require(*mean, dtype::f32, {n}, "layernorm mean");
  if (rstd) require(*rstd, dtype::f32, {n}, "layernorm rstd");
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* bp = b.data<float>();
  float* yp = y.data<float>();
  float* mp = mean ? mean->data<float>() : nullptr;
  float* rp = rstd ? rstd->data<float>() : nullptr;
  const float inv_d = 1.0f / static_cast<float>(d);
  parallel_for(n, 4 * d, [&](std::int64_t r) {
    const float* xr = xp + r * d;
    float* yr = yp + r * d;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (std::int64_t i = 0; i < d; ++i) s += xr[i];
    const float m = s * inv_d;
    // two-pass variance: no cancellation for rows with a large mean
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (std::int64_t i = 0; i < d; ++i) v += (xr[i] - m) * (xr[i] - m);
    const float rs = 1.0f / std::sqrt(v * inv_d + eps);
#pragma omp simd
    for (std::int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * rs * wp[i] + bp[i];
    if (mp) mp[r] = m;
    if (rp) rp[r] = rs;
  });
}

void cpu_backend_impl::layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dy, Tensor& dx,
                                          Tensor& dw, Tensor& db) {
  check_rows(x, "layernorm_backward x");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require(w, dtype::f32, {d}, "layernorm_backward w");
  require(mean, dtype::f32, {n}, "layernorm_backward mean");
  require(rstd, dtype::f32, {n}, "layernorm_backward rstd");
  require(dy, dtype::f32, {n, d}, "layernorm_backward dy");
  require(dx, dtype::f32, {n, d}, "layernorm_backward dx");
  require(dw, dtype::f32, {d}, "layernorm_backward dw");
  require(db, dtype::f32, {d}, "layernorm_backward db");
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  const float* gp = dy.data<float>();
  float* dxp = dx.data<float>();
  float* dwp = dw.data<float>();
  float* dbp = db.data<float>();
  const float inv_d = 1.0f / static_cast<float>(d);

  // With xhat = (x - mean) * r and g = dy * w:
  // dx = r * (g - mean(g) - xhat * mean(g * xhat))
  parallel_for(n, 6 * d, [&](std::int64_t row) {
    const float* xr = xp + row * d;
    const float* g = gp + row * d;
    float* o = dxp + row * d;
    const float* wr = wp;  // a local copy: GCC gathers through captured pointers in simd reductions
    const float m = mp[row], r = rp[row];
    float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
    for (std::int64_t i = 0; i < d; ++i) {
      const float gi = g[i] * wr[i];
      sg += gi;
      sgx += gi * (xr[i] - m) * r;
    }
    const float mg = sg * inv_d, mgx = sgx * inv_d;
#pragma omp simd
    for (std::int64_t i = 0; i < d; ++i)
      o[i] = r * (g[i] * wr[i] - mg - (xr[i] - m) * r * mgx);
  });
  // dw += dy * xhat, db += dy, summed over rows
  parallel_ranges(d, 2 * n, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t row = 0; row < n; ++row) {
      const float* xr = xp + row * d;
      const float* g = gp + row * d;
      const float m = mp[row], r = rp[row];
#pragma omp simd
      for (std::int64_t c = c0; c < c1; ++c) {
        dwp[c] += g[c] * (xr[c] - m) * r;
        dbp[c] += g[c];
      }
    }
  });
}

}  // namespace corolla::cpu
