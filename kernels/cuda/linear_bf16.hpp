// kernels/cuda/linear_bf16.hpp — linear with an f32 input and a bf16
// (inference) weight, launcher only (host-only: no CUDA types).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// y[rows, out] = x[rows, in] @ w[out, in]^T (+ bias[out] when not null),
/// x, bias, y f32 and w bf16, products summed in f32 (see Backend::linear).
/// One warp per output feature takes up to 8 rows per pass over the weight
/// row, so batch-1 to batch-8 decode reads every weight once (16-byte loads
/// when in % 8 == 0 and x, w are 16-byte aligned); more rows make more
/// passes (correct, not tuned for prefill). rows, in, out > 0.
///
/// Batch-1 calls on the 16-byte path have launch variants (rows per pass,
/// loads in flight per lane, warps per block; gemv_variant_names) that give
/// bit-identical results. The first batch-1 call for a (device, in, out)
/// times each on the call's own buffers and keeps the fastest (not while
/// the stream is being captured); COROLLA_GEMV=<variant> in the environment
/// fixes one instead (COROLLA_GEMV=auto is the default). Other calls take
/// the default variant. The kernel is launched as an early dependent
/// (device.hpp, set_early_launch) where the device has that.
void linear_bf16_weight(stream_t s, const float* x, std::int64_t rows, std::int64_t in,
                        const void* w, std::int64_t out, const float* bias, float* y);

/// The 16-byte GEMV's launch variants, "r<rows per pass>.u<loads in flight
/// per lane>.w<warps per block>"; the first is the default.
std::vector<std::string> gemv_variant_names();

/// Fixes the batch-1 variant for every later call in the process (an index
/// into gemv_variant_names(); out of range throws std::out_of_range), or
/// with -1 goes back to timing a shape's first call (COROLLA_GEMV's role,
/// for tests and benchmarks that compare variants in one process).
void set_gemv_variant(int index);

/// What the first batch-1 call for one weight shape chose (linear_bf16_weight).
struct gemv_choice {
  int device = 0;
  std::int64_t in = 0, out = 0;
  int chosen = 0;                   ///< index into gemv_variant_names()
  std::vector<double> microseconds;  ///< per launch of each variant; empty when not timed
};

/// Every shape chosen for so far in this process, in the order first seen.
std::vector<gemv_choice> gemv_choices();

}  // namespace corolla::cuda
