// kernels/cuda/norm.cu — RMSNorm (Llama) and LayerNorm (GPT-2), forward and
// backward. One block per row for the forward and for dx; the parameter
// gradients sum over rows, one thread per column walking the rows in order
// (no atomics: deterministic). Formulas as in kernels/cpu/cpu_norm.cpp.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/norm.hpp"

namespace corolla::cuda {
namespace {

constexpr int row_threads = 256;

__global__ void rmsnorm_forward_kernel(const float* x, const float* w, float eps, float* y,
                                       float* rstd, std::int64_t d) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float* yr = y + row * d;
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) s += xr[i] * xr[i];
  s = block_sum(s);
  const float rs = 1.0f / sqrtf(s / static_cast<float>(d) + eps);
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * rs * w[i];
  if (rstd && threadIdx.x == 0) rstd[row] = rs;
}

/// sum = a + b, y = rmsnorm(sum): the rmsnorm kernel on the sum it writes.
__global__ void add_rmsnorm_kernel(const float* a, const float* b, float* sum, const float* w, float eps,
                                   float* y, std::int64_t d) {
  const std::int64_t row = blockIdx.x;
  const float* ar = a + row * d;
  const float* br = b + row * d;
  float* sr = sum + row * d;
  float* yr = y + row * d;
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = ar[i] + br[i];
    sr[i] = v;
    s += v * v;
  }
  s = block_sum(s);
  const float rs = 1.0f / sqrtf(s / static_cast<float>(d) + eps);
  // Each thread reads back only the elements it wrote.
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = sr[i] * rs * w[i];
}

// dx_j = r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)),  r = rstd
__global__ void rmsnorm_backward_dx_kernel(const float* x, const float* w, const float* rstd,
                                           const float* dy, float* dx, std::int64_t d) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  const float* g = dy + row * d;
  float* o = dx + row * d;
  const float r = rstd[row];
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) s += w[i] * g[i] * xr[i];
  s = block_sum(s);
  const float c = r * r * s / static_cast<float>(d);
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = r * (w[i] * g[i] - xr[i] * c);
}

// dw_j += sum_rows dy_j x_j r
__global__ void rmsnorm_backward_dw_kernel(const float* x, const float* rstd, const float* dy,
                                           float* dw, std::int64_t n, std::int64_t d) {
  float total[1];
  auto value = [=](std::int64_t r, std::int64_t c, float* s) { s[0] += dy[r * d + c] * x[r * d + c] * rstd[r]; };
  if (column_sums<1>(n, d, value, total)) dw[std::int64_t{blockIdx.x} * column_tile + threadIdx.x] += total[0];
}

__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* b,
                                         float eps, float* y, float* mean, float* rstd,
                                         std::int64_t d) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float* yr = y + row * d;
  const float inv_d = 1.0f / static_cast<float>(d);
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
  const float m = block_sum(s) * inv_d;
  // two-pass variance: no cancellation for rows with a large mean
  float v = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) v += (xr[i] - m) * (xr[i] - m);
  v = block_sum(v);
  const float rs = 1.0f / sqrtf(v * inv_d + eps);
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = (xr[i] - m) * rs * w[i] + b[i];
  if (threadIdx.x == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

// With xhat = (x - mean) * r and g = dy * w:
// dx = r * (g - mean(g) - xhat * mean(g * xhat))
__global__ void layernorm_backward_dx_kernel(const float* x, const float* w, const float* mean,
                                             const float* rstd, const float* dy, float* dx,
                                             std::int64_t d) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  const float* g = dy + row * d;
  float* o = dx + row * d;
  const float m = mean[row], r = rstd[row];
  const float inv_d = 1.0f / static_cast<float>(d);
  float sg = 0.0f, sgx = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float gi = g[i] * w[i];
    sg += gi;
    sgx += gi * (xr[i] - m) * r;
  }
  sg = block_sum(sg);
  sgx = block_sum(sgx);
  const float mg = sg * inv_d, mgx = sgx * inv_d;
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x)
    o[i] = r * (g[i] * w[i] - mg - (xr[i] - m) * r * mgx);
}

// dw += dy * xhat, db += dy, summed over rows
__global__ void layernorm_backward_dwdb_kernel(const float* x, const float* mean,
                                               const float* rstd, const float* dy, float* dw,
                                               float* db, std::int64_t n, std::int64_t d) {
  float total[2];
  auto value = [=](std::int64_t r, std::int64_t c, float* s) {
    const float g = dy[r * d + c];
    s[0] += g * (x[r * d + c] - mean[r]) * rstd[r];
    s[1] += g;
  };
  if (!column_sums<2>(n, d, value, total)) return;
  const std::int64_t c = std::int64_t{blockIdx.x} * column_tile + threadIdx.x;
  dw[c] += total[0];
  db[c] += total[1];
}

}  // namespace

// ---- launchers -------------------------------------------------------------------

/// Threads per row of a forward norm: few rows (decode) leave most SMs idle,
/// so each row gets a whole 1024-thread block and a quarter of the serial
/// loads per thread (9 us -> about 3 for one 4096-wide row on an H100).
unsigned forward_threads(std::int64_t rows) { return rows < 128 ? 1024 : row_threads; }

void rmsnorm_forward(stream_t s, const float* x, const float* w, float eps, float* y,
                     float* rstd, std::int64_t n, std::int64_t d) {
  if (n <= 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(n), forward_threads(n), 0, s>>>(x, w, eps, y,
                                                                                  rstd, d);
  COROLLA_CUDA_LAUNCH_CHECK("rmsnorm_forward_kernel");
}

void add_rmsnorm(stream_t s, const float* a, const float* b, float* sum, const float* w, float eps, float* y,
                 std::int64_t n, std::int64_t d) {
  if (n <= 0) return;
  add_rmsnorm_kernel<<<static_cast<unsigned>(n), forward_threads(n), 0, s>>>(a, b, sum, w, eps, y, d);
  COROLLA_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
}

void rmsnorm_backward(stream_t s, const float* x, const float* w, const float* rstd,
                      const float* dy, float* dx, float* dw, std::int64_t n, std::int64_t d) {
  if (n <= 0 || d <= 0) return;
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(n), row_threads, 0, s>>>(x, w, rstd, dy,
                                                                              dx, d);
  COROLLA_CUDA_LAUNCH_CHECK("rmsnorm_backward_dx_kernel");
  rmsnorm_backward_dw_kernel<<<column_tiles(d), dim3(column_tile, column_tile), 0, s>>>(x, rstd, dy, dw, n, d);
  COROLLA_CUDA_LAUNCH_CHECK("rmsnorm_backward_dw_kernel");
}

void layernorm_forward(stream_t s, const float* x, const float* w, const float* b, float eps,
                       float* y, float* mean, float* rstd, std::int64_t n, std::int64_t d) {
  if (n <= 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(n), forward_threads(n), 0, s>>>(
      x, w, b, eps, y, mean, rstd, d);
  COROLLA_CUDA_LAUNCH_CHECK("layernorm_forward_kernel");
}

void layernorm_backward(stream_t s, const float* x, const float* w, const float* mean,
                        const float* rstd, const float* dy, float* dx, float* dw, float* db,
                        std::int64_t n, std::int64_t d) {
  if (n <= 0 || d <= 0) return;
  layernorm_backward_dx_kernel<<<static_cast<unsigned>(n), row_threads, 0, s>>>(
      x, w, mean, rstd, dy, dx, d);
  COROLLA_CUDA_LAUNCH_CHECK("layernorm_backward_dx_kernel");
  layernorm_backward_dwdb_kernel<<<column_tiles(d), dim3(column_tile, column_tile), 0, s>>>(x, mean, rstd, dy, dw, db, n, d);
  COROLLA_CUDA_LAUNCH_CHECK("layernorm_backward_dwdb_kernel");
}

}  // namespace corolla::cuda
