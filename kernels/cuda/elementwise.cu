// kernels/cuda/elementwise.cu — activations (SwiGLU, tanh-GELU), add, scale,
// sum of squares, and the bias broadcast / column sums of linear. Kernels
// first, launchers after. Same formulas as kernels/cpu/cpu_elementwise.cpp.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/elementwise.hpp"

namespace corolla::cuda {
namespace {

/// sqrt(2/pi), the tanh-GELU constant ("gelu_new" in HuggingFace).
constexpr float gelu_k = 0.7978845608028654f;
constexpr float gelu_c = 0.044715f;

#define COROLLA_GRID_STRIDE(i, n)                                                   \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{gridDim.x} * blockDim.x)

template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, std::int64_t n) {
  COROLLA_GRID_STRIDE(i, n) {
    const float x = load_f32(gate, i), u = load_f32(up, i);
    store_f32(out, i, x / (1.0f + expf(-x)) * u);
  }
}

// silu(x) = x s, s = sigmoid(x); silu'(x) = s (1 + x (1 - s))
template <class T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dout, T* dgate,
                                       T* dup, std::int64_t n) {
  COROLLA_GRID_STRIDE(i, n) {
    const float x = load_f32(gate, i), u = load_f32(up, i), d = load_f32(dout, i);
    const float sg = 1.0f / (1.0f + expf(-x));
    store_f32(dgate, i, d * u * sg * (1.0f + x * (1.0f - sg)));
    store_f32(dup, i, d * x * sg);
  }
}

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, std::int64_t n) {
  COROLLA_GRID_STRIDE(i, n) {
    const float v = load_f32(x, i);
    store_f32(y, i, 0.5f * v * (1.0f + tanhf(gelu_k * (v + gelu_c * v * v * v))));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, std::int64_t n) {
  COROLLA_GRID_STRIDE(i, n) {
    const float v = load_f32(x, i);
    const float t = tanhf(gelu_k * (v + gelu_c * v * v * v));
    const float dt = gelu_k * (1.0f + 3.0f * gelu_c * v * v);
    store_f32(dx, i, load_f32(dy, i) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dt));
  }
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  COROLLA_GRID_STRIDE(i, n) store_f32(out, i, load_f32(a, i) + load_f32(b, i));
}

template <class T>
__global__ void scale_kernel(T* y, float alpha, std::int64_t n) {
  COROLLA_GRID_STRIDE(i, n) store_f32(y, i, load_f32(y, i) * alpha);
}

constexpr int sum_squares_threads = 256;
/// Elements per sum_squares block: each thread adds 16 (strided) in f64.
constexpr std::int64_t sum_squares_chunk = sum_squares_threads * 16;

template <class T>
__global__ void sum_squares_partial_kernel(const T* x, std::int64_t n, double* partials) {
  const std::int64_t begin = blockIdx.x * sum_squares_chunk;
  const std::int64_t end = begin + sum_squares_chunk < n ? begin + sum_squares_chunk : n;
  double s = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = load_f32(x, i);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/// One block: each thread sums a strided subset of partials in order, then
/// the block sum (fixed order) gives the total.
__global__ void sum_partials_kernel(const double* partials, std::int64_t count, double* result) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *result = s;
}

template <class B, class O>
__global__ void broadcast_rows_kernel(const B* bias, O* out, std::int64_t rows,
                                      std::int64_t cols) {
  COROLLA_GRID_STRIDE(i, rows * cols) store_f32(out, i, load_f32(bias, i % cols));
}

/// acc += the column sums of x (column_sums: 32 x 32 threads per 32 columns).
template <class X, class A>
__global__ void column_sum_kernel(const X* x, std::int64_t rows, std::int64_t cols, A* acc) {
  float total[1];
  auto value = [x, cols](std::int64_t r, std::int64_t c, float* s) { s[0] += load_f32(x, r * cols + c); };
  if (!column_sums<1>(rows, cols, value, total)) return;
  const std::int64_t c = std::int64_t{blockIdx.x} * column_tile + threadIdx.x;
  store_f32(acc, c, load_f32(acc, c) + total[0]);
}

}  // namespace

// ---- launchers -------------------------------------------------------------------

void swiglu_forward(stream_t s, elem t, const void* gate, const void* up, void* out,
                    std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<T><<<grid_for(n), elementwise_threads, 0, s>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
    COROLLA_CUDA_LAUNCH_CHECK("swiglu_forward_kernel");
  });
}

void swiglu_backward(stream_t s, elem t, const void* gate, const void* up, const void* dout,
                     void* dgate, void* dup, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<grid_for(n), elementwise_threads, 0, s>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dout),
        static_cast<T*>(dgate), static_cast<T*>(dup), n);
    COROLLA_CUDA_LAUNCH_CHECK("swiglu_backward_kernel");
  });
}

void gelu_forward(stream_t s, elem t, const void* x, void* y, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<T><<<grid_for(n), elementwise_threads, 0, s>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n);
    COROLLA_CUDA_LAUNCH_CHECK("gelu_forward_kernel");
  });
}

void gelu_backward(stream_t s, elem t, const void* x, const void* dy, void* dx, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<grid_for(n), elementwise_threads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n);
    COROLLA_CUDA_LAUNCH_CHECK("gelu_backward_kernel");
  });
}

void add(stream_t s, elem t, const void* a, const void* b, void* out, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<grid_for(n), elementwise_threads, 0, s>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
    COROLLA_CUDA_LAUNCH_CHECK("add_kernel");
  });
}

void scale(stream_t s, elem t, void* y, float alpha, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), elementwise_threads, 0, s>>>(static_cast<T*>(y), alpha, n);
    COROLLA_CUDA_LAUNCH_CHECK("scale_kernel");
  });
}

std::int64_t sum_squares_blocks(std::int64_t n) {
  return n <= 0 ? 0 : (n + sum_squares_chunk - 1) / sum_squares_chunk;
}

void sum_squares(stream_t s, elem t, const void* x, std::int64_t n, double* partials,
                 double* result) {
  const std::int64_t blocks = sum_squares_blocks(n);
  if (blocks > 0) {
    dispatch_elem(t, [&](auto tag) {
      using T = decltype(tag);
      sum_squares_partial_kernel<T><<<static_cast<unsigned>(blocks), sum_squares_threads, 0, s>>>(
          static_cast<const T*>(x), n, partials);
      COROLLA_CUDA_LAUNCH_CHECK("sum_squares_partial_kernel");
    });
  }
  sum_partials_kernel<<<1, 256, 0, s>>>(partials, blocks, result);  // blocks == 0 writes 0
  COROLLA_CUDA_LAUNCH_CHECK("sum_partials_kernel");
}

void broadcast_rows(stream_t s, const void* bias, elem bias_t, void* out, elem out_t,
                    std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  dispatch_elem(bias_t, [&](auto btag) {
    using B = decltype(btag);
    dispatch_elem(out_t, [&](auto otag) {
      using O = decltype(otag);
      broadcast_rows_kernel<B, O><<<grid_for(n), elementwise_threads, 0, s>>>(
          static_cast<const B*>(bias), static_cast<O*>(out), rows, cols);
      COROLLA_CUDA_LAUNCH_CHECK("broadcast_rows_kernel");
    });
  });
}

void column_sum_accumulate(stream_t s, const void* x, elem x_t, std::int64_t rows,
                           std::int64_t cols, void* acc, elem acc_t) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_elem(x_t, [&](auto xtag) {
    using X = decltype(xtag);
    dispatch_elem(acc_t, [&](auto atag) {
      using A = decltype(atag);
      column_sum_kernel<X, A><<<column_tiles(cols), dim3(column_tile, column_tile), 0, s>>>(
          static_cast<const X*>(x), rows, cols, static_cast<A*>(acc));
      COROLLA_CUDA_LAUNCH_CHECK("column_sum_kernel");
    });
  });
}

}  // namespace corolla::cuda
