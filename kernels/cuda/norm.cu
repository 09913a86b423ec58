// kernels/cuda/norm.cu — RMSNorm (Llama) and LayerNorm (GPT-2), forward and
// backward. One block per row for the forward and for dx; the parameter
// gradients are column sums over the rows (column_sums.cuh: chunks of rows,
// no atomics, deterministic). Formulas as in
// kernels/cpu/cpu_norm.cpp. The kernels are in norm_kernels.cuh.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/cuda/norm.hpp"

namespace corolla::cuda {

// ---- launchers -------------------------------------------------------------------

/// Threads per row of a forward norm: few rows (decode) leave most SMs idle,
/// so each row gets a whole 1024-thread block and a quarter of the serial
/// loads per thread (9 us -> about 3 for one 4096-wide row on an H100).
unsigned forward_threads(std::int64_t rows) { return rows < 128 ? 1024 : row_threads; }

void rmsnorm_forward(stream_t s, elem t, const void* x, const float* w, float eps, void* y, float* rstd,
                     std::int64_t n, std::int64_t d) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("rmsnorm_forward_kernel", &rmsnorm_forward_kernel<T>,
        dim3(static_cast<unsigned>(n)), dim3(forward_threads(n)), 0, s,
        static_cast<const T*>(x), w, eps, static_cast<T*>(y), rstd, d);
  });
}

void add_rmsnorm(stream_t s, elem t, const void* a, const void* b, void* sum, const float* w, float eps, void* y,
                 std::int64_t n, std::int64_t d) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("add_rmsnorm_kernel", &add_rmsnorm_kernel<T>,
        dim3(static_cast<unsigned>(n)), dim3(forward_threads(n)), 0, s,
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(sum), w, eps, static_cast<T*>(y), d);
  });
}

void rmsnorm_backward(stream_t s, elem t, const void* x, const float* w, const float* rstd, const void* dy,
                      void* dx, float* dw, std::int64_t n, std::int64_t d, float* partials, const void* dres) {
  if (n <= 0 || d <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    const T* dyt = static_cast<const T*>(dy);
    rmsnorm_backward_dx_kernel<T><<<static_cast<unsigned>(n), row_threads, 0, s>>>(
        xt, w, rstd, dyt, static_cast<T*>(dx), d, static_cast<const T*>(dres));
    COROLLA_CUDA_LAUNCH_CHECK("rmsnorm_backward_dx_kernel");
    launch_column_sums(s, "rmsnorm_backward_dw_kernel", &rmsnorm_backward_dw_kernel<T>, n, d,
                       column_out<1, float>{{dw}, partials}, xt, rstd, dyt, n, d);
  });
}

void layernorm_forward(stream_t s, elem t, const void* x, const float* w, const float* b, float eps, void* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t d) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("layernorm_forward_kernel", &layernorm_forward_kernel<T>,
        dim3(static_cast<unsigned>(n)), dim3(forward_threads(n)), 0, s,
        static_cast<const T*>(x), w, b, eps, static_cast<T*>(y), mean, rstd, d);
  });
}

void layernorm_backward(stream_t s, elem t, const void* x, const float* w, const float* mean, const float* rstd,
                        const void* dy, void* dx, float* dw, float* db, std::int64_t n, std::int64_t d,
                        float* partials, const void* dres) {
  if (n <= 0 || d <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    const T* dyt = static_cast<const T*>(dy);
    layernorm_backward_dx_kernel<T><<<static_cast<unsigned>(n), row_threads, 0, s>>>(
        xt, w, mean, rstd, dyt, static_cast<T*>(dx), d, static_cast<const T*>(dres));
    COROLLA_CUDA_LAUNCH_CHECK("layernorm_backward_dx_kernel");
    launch_column_sums(s, "layernorm_backward_dwdb_kernel", &layernorm_backward_dwdb_kernel<T>, n, d,
                       column_out<2, float>{{dw, db}, partials}, xt, mean, rstd, dyt, n, d);
  });
}

}  // namespace corolla::cuda
