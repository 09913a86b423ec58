// kernels/vendor_gemm.hpp — the vendor BLAS's own GEMM, called directly with
// no Backend in between: the baseline `corolla bench gemm` compares
// Backend::linear against, measured in the same run on the same device.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/tensor.hpp"

namespace corolla {

/// One timed vendor product.
struct vendor_gemm_timing {
  double seconds = 0;   ///< best round's seconds per product
  std::string library;  ///< "OpenBLAS cblas_sgemm" or "cuBLASLt"
};

/// Times y[m,n] = x[m,k] @ w[n,k]^T (row-major, Backend::linear's layout) in
/// dtype `t` on `dev` with the vendor library: OpenBLAS `cblas_sgemm` on the
/// CPU (f32 only, OpenBLAS's own threading with the CPU backend's thread
/// count), cuBLASLt on CUDA (f32, bf16,
/// f16; see kernels/cuda/cublas_reference.hpp). Inputs are pseudo-random
/// values in [-1, 1). Each of `rounds` rounds runs `calls` products and
/// waits for them; the best round counts. Throws std::invalid_argument for a
/// dtype the device's library is not timed with, std::runtime_error when the
/// device is not compiled in or a library call fails.
vendor_gemm_timing time_vendor_linear(device dev, dtype t, std::int64_t m, std::int64_t n,
                                      std::int64_t k, int calls, int rounds);

}  // namespace corolla
