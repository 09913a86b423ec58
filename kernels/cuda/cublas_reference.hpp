// kernels/cuda/cublas_reference.hpp — raw cuBLASLt products timed directly,
// without the Backend in between: the "what cuBLAS itself reaches" baseline
// of `corolla bench gemm` and the peak of `bench train`'s MFU on CUDA.
// Host-only: no CUDA types.
#pragma once

#include <cstdint>

#include "kernels/tensor.hpp"

namespace corolla::cuda {

/// Seconds per product of y[m,n] = x[m,k] @ w[n,k]^T (row-major, linear's
/// layout) made with cuBLASLt directly on device `index`: its own handle,
/// stream and 32 MiB workspace (as the backend's), x, w and y of dtype `t`
/// (f32, bf16 or f16) filled with pseudo-random values in [-1, 1),
/// CUBLAS_COMPUTE_32F with f32 scale (no TF32, as the backend), the
/// heuristic's first algorithm. Each of `rounds` rounds queues `calls`
/// products and synchronises the stream, timed on the host clock (the same
/// way the bench times Backend::linear, so launch overhead counts on both
/// sides); returns the best round's time per product. Buffers are freed
/// before returning. Throws std::runtime_error naming the failing call, or
/// when cuBLASLt has no algorithm for the problem.
double cublaslt_linear_seconds(int index, dtype t, std::int64_t m, std::int64_t n, std::int64_t k,
                               int calls, int rounds);

}  // namespace corolla::cuda
