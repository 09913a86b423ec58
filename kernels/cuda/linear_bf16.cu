// kernels/cuda/linear_bf16.cu — linear with a bf16 weight and f32
// activations: a GEMV-style kernel, one warp per output feature.
//
// Batch-1 decode is bound by reading the weights; each warp streams one
// weight row once per pass (8 bf16 per lane per 16-byte load), widens them
// to f32 in registers (a bf16 is the upper half of an f32) and keeps one
// f32 accumulator per row of the pass, reduced across the warp with
// shuffles at the end. The bias is added by lane 0 as it writes.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/linear_bf16.hpp"
#include "kernels/cuda/linear_bf16_kernels.cuh"

namespace corolla::cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace

void linear_bf16_weight(stream_t s, const float* x, std::int64_t rows, std::int64_t in,
                        const void* w, std::int64_t out, const float* bias, float* y) {
  if (rows <= 0 || in <= 0 || out <= 0) return;
  const auto* wp = static_cast<const std::uint16_t*>(w);
  const unsigned blocks = static_cast<unsigned>((out + warps_per_block - 1) / warps_per_block);
  const unsigned threads = 32 * warps_per_block;
  if (in % 8 == 0 && aligned16(x) && aligned16(w)) {
    linear_bf16_kernel<true><<<blocks, threads, 0, s>>>(x, rows, in, wp, out, bias, y);
    COROLLA_CUDA_LAUNCH_CHECK("linear_bf16_kernel (16-byte loads)");
  } else {
    linear_bf16_kernel<false><<<blocks, threads, 0, s>>>(x, rows, in, wp, out, bias, y);
    COROLLA_CUDA_LAUNCH_CHECK("linear_bf16_kernel");
  }
}

}  // namespace corolla::cuda
