// kernels/cuda/elementwise.cu — activations (SwiGLU, tanh-GELU), add, scale,
// sum of squares, and the bias broadcast / column sums of linear: the
// launchers (the kernels are in elementwise_kernels.cuh). Same formulas as
// kernels/cpu/cpu_elementwise.cpp.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/elementwise.hpp"

namespace corolla::cuda {

// ---- launchers -------------------------------------------------------------------

void swiglu_forward(stream_t s, elem t, const void* gate, const void* up, void* out,
                    std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("swiglu_forward_kernel", &swiglu_forward_kernel<T>,
        dim3(grid_for(n)), dim3(elementwise_threads), 0, s,
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
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
    launch_dependent("gelu_forward_kernel", &gelu_forward_kernel<T>,
        dim3(grid_for(n)), dim3(elementwise_threads), 0, s,
        static_cast<const T*>(x), static_cast<T*>(y), n);
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
    launch_dependent("add_kernel", &add_kernel<T>, dim3(grid_for(n)), dim3(elementwise_threads), 0, s,
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
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
                           std::int64_t cols, void* acc, elem acc_t, float* partials) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_elem(x_t, [&](auto xtag) {
    using X = decltype(xtag);
    dispatch_elem(acc_t, [&](auto atag) {
      using A = decltype(atag);
      launch_column_sums(s, "column_sum_kernel", &column_sum_kernel<X, A>, rows, cols,
                         column_out<1, A>{{static_cast<A*>(acc)}, partials}, static_cast<const X*>(x), rows, cols);
    });
  });
}

}  // namespace corolla::cuda
