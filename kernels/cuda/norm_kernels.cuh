// kernels/cuda/norm_kernels.cuh — the RMSNorm and LayerNorm kernels (norm.cu
// says how they work). Included by norm.cu, and by tests/cuda_emulated/,
// which runs them on the CPU against an emulation of the CUDA features they
// use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"
#include "kernels/cuda/grid_dependency.cuh"

namespace corolla::cuda {
namespace {

constexpr int row_threads = 256;

// Activations (x, y, a, b, sum, dy, dx) are stored as T (f32, bf16 or f16)
// and read into f32; the weights, the saved statistics and the parameter
// gradients are f32; every sum is f32.

template <class T>
__global__ void rmsnorm_forward_kernel(const T* x, const float* w, float eps, T* y, float* rstd,
                                       std::int64_t d) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = load_f32(xr, i);
    s += v * v;
  }
  s = block_sum(s);
  const float rs = 1.0f / sqrtf(s / static_cast<float>(d) + eps);
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) store_f32(yr, i, load_f32(xr, i) * rs * w[i]);
  if (rstd && threadIdx.x == 0) rstd[row] = rs;
}

/// sum = a + b, y = rmsnorm(sum): the rmsnorm kernel on the sum it writes
/// (as stored: in 16-bit storage the rounded sum, so the result equals add
/// then rmsnorm bit for bit).
template <class T>
__global__ void add_rmsnorm_kernel(const T* a, const T* b, T* sum, const float* w, float eps, T* y,
                                   std::int64_t d) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  const std::int64_t row = blockIdx.x;
  const T* ar = a + row * d;
  const T* br = b + row * d;
  T* sr = sum + row * d;
  T* yr = y + row * d;
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    store_f32(sr, i, load_f32(ar, i) + load_f32(br, i));
    const float v = load_f32(sr, i);
    s += v * v;
  }
  s = block_sum(s);
  const float rs = 1.0f / sqrtf(s / static_cast<float>(d) + eps);
  // Each thread reads back only the elements it wrote.
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) store_f32(yr, i, load_f32(sr, i) * rs * w[i]);
}

// dx_j = r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)),  r = rstd;
// with dres (the residual's gradient, may be null) added before the one
// rounding on store, by __fadd_rn (no contraction into the product: the
// f32 result is the add kernel's on the f32 dx, bit for bit).
template <class T>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const float* w, const float* rstd, const T* dy, T* dx,
                                           std::int64_t d, const T* dres) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* g = dy + row * d;
  T* o = dx + row * d;
  const float r = rstd[row];
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) s += w[i] * load_f32(g, i) * load_f32(xr, i);
  s = block_sum(s);
  const float c = r * r * s / static_cast<float>(d);
  const T* res = dres ? dres + row * d : nullptr;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = r * (w[i] * load_f32(g, i) - load_f32(xr, i) * c);
    store_f32(o, i, res ? __fadd_rn(v, load_f32(res, i)) : v);
  }
}

// dw_j += sum_rows dy_j x_j r
template <class T>
__global__ void rmsnorm_backward_dw_kernel(const T* x, const float* rstd, const T* dy, std::int64_t n, std::int64_t d,
                                           std::int64_t chunk_rows, column_out<1, float> out) {
  float total[1];
  auto value = [=](std::int64_t r, std::int64_t c, float* s) {
    s[0] += load_f32(dy, r * d + c) * load_f32(x, r * d + c) * rstd[r];
  };
  if (column_sums<1>(n, d, chunk_rows, value, total)) column_sums_store(out, d, total);
}

template <class T>
__global__ void layernorm_forward_kernel(const T* x, const float* w, const float* b, float eps, T* y, float* mean,
                                         float* rstd, std::int64_t d) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  const float inv_d = 1.0f / static_cast<float>(d);
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) s += load_f32(xr, i);
  const float m = block_sum(s) * inv_d;
  // two-pass variance: no cancellation for rows with a large mean
  float v = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = load_f32(xr, i) - m;
    v += c * c;
  }
  v = block_sum(v);
  const float rs = 1.0f / sqrtf(v * inv_d + eps);
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x)
    store_f32(yr, i, (load_f32(xr, i) - m) * rs * w[i] + b[i]);
  if (threadIdx.x == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

// With xhat = (x - mean) * r and g = dy * w:
// dx = r * (g - mean(g) - xhat * mean(g * xhat)); dres as in
// rmsnorm_backward_dx_kernel.
template <class T>
__global__ void layernorm_backward_dx_kernel(const T* x, const float* w, const float* mean, const float* rstd,
                                             const T* dy, T* dx, std::int64_t d, const T* dres) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* g = dy + row * d;
  T* o = dx + row * d;
  const float m = mean[row], r = rstd[row];
  const float inv_d = 1.0f / static_cast<float>(d);
  float sg = 0.0f, sgx = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float gi = load_f32(g, i) * w[i];
    sg += gi;
    sgx += gi * (load_f32(xr, i) - m) * r;
  }
  sg = block_sum(sg);
  sgx = block_sum(sgx);
  const float mg = sg * inv_d, mgx = sgx * inv_d;
  const T* res = dres ? dres + row * d : nullptr;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = r * (load_f32(g, i) * w[i] - mg - (load_f32(xr, i) - m) * r * mgx);
    store_f32(o, i, res ? __fadd_rn(v, load_f32(res, i)) : v);
  }
}

// dw += dy * xhat, db += dy, summed over rows (out.acc: dw, db)
template <class T>
__global__ void layernorm_backward_dwdb_kernel(const T* x, const float* mean, const float* rstd, const T* dy,
                                               std::int64_t n, std::int64_t d, std::int64_t chunk_rows,
                                               column_out<2, float> out) {
  float total[2];
  auto value = [=](std::int64_t r, std::int64_t c, float* s) {
    const float g = load_f32(dy, r * d + c);
    s[0] += g * (load_f32(x, r * d + c) - mean[r]) * rstd[r];
    s[1] += g;
  };
  if (column_sums<2>(n, d, chunk_rows, value, total)) column_sums_store(out, d, total);
}

}  // namespace
}  // namespace corolla::cuda
