// kernels/cuda/elementwise_kernels.cuh — the activation (SwiGLU, tanh-GELU),
// add, scale, sum-of-squares, bias broadcast and column-sum kernels. Included
// by elementwise.cu, and by tests/cuda_emulated/, which runs them on the CPU
// against an emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"
#include "kernels/cuda/grid_dependency.cuh"

namespace corolla::cuda {
namespace {

#define COROLLA_GRID_STRIDE(i, n)                                                   \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{gridDim.x} * blockDim.x)

template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, std::int64_t n) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  COROLLA_GRID_STRIDE(i, n) {
    store_f32(out, i, silu_times(load_f32(gate, i), load_f32(up, i)));
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
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  COROLLA_GRID_STRIDE(i, n) {
    store_f32(y, i, gelu_tanh(load_f32(x, i)));
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
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
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

/// acc += the column sums of x (column_sums.cuh: 32 x 32 threads per 32
/// columns of one chunk of rows).
template <class X, class A>
__global__ void column_sum_kernel(const X* x, std::int64_t rows, std::int64_t cols, std::int64_t chunk_rows,
                                  column_out<1, A> out) {
  float total[1];
  auto value = [x, cols](std::int64_t r, std::int64_t c, float* s) { s[0] += load_f32(x, r * cols + c); };
  if (column_sums<1>(rows, cols, chunk_rows, value, total)) column_sums_store(out, cols, total);
}

}  // namespace
}  // namespace corolla::cuda
