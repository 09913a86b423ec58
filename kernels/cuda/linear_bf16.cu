// kernels/cuda/linear_bf16.cu — linear with a bf16 weight and f32
// activations: a GEMV-style kernel, one warp per output feature.
//
// Batch-1 decode is bound by reading the weights; each warp streams one
// weight row once per pass (8 bf16 per lane per 16-byte load), widens them
// to f32 in registers (a bf16 is the upper half of an f32) and keeps one
// f32 accumulator per row of the pass, reduced across the warp with
// shuffles at the end. The bias is added by lane 0 as it writes.
//
// Launch variants (loads in flight per lane x warps per block) all sum an
// output's products in the same lane order, so they give bit-identical
// results and the fastest can be picked per weight shape by timing, with
// no effect on what decode computes (linear_bf16.hpp). The kernel is an
// early-launch dependent (grid_dependency.cuh): it asks L2 for its weight
// row while the norm, attention or activation before it finishes.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/linear_bf16.hpp"
#include "kernels/cuda/linear_bf16_kernels.cuh"

namespace corolla::cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// The variant set_gemv_variant fixed (-1: time them; -2: not called, so
/// COROLLA_GEMV decides).
std::atomic<int> forced_variant{-2};

/// -1 for auto (time the variants), else the fixed index: set_gemv_variant's
/// or COROLLA_GEMV's. Throws for a COROLLA_GEMV that names no variant.
int fixed_variant() {
  if (const int forced = forced_variant.load(); forced != -2) return forced;
  static const char* const env = std::getenv("COROLLA_GEMV");
  static const int from_env = [] {
    if (env == nullptr || *env == '\0' || std::string(env) == "auto") return -1;
    for (int i = 0; i < gemv_variant_count; ++i)
      if (std::string(env) == gemv_variants[i].name) return i;
    return -2;
  }();
  if (from_env == -2) {
    std::string names = "auto";
    for (const gemv_variant& c : gemv_variants) names += std::string(", ") + c.name;
    throw std::invalid_argument("COROLLA_GEMV=" + std::string(env) + ": not a GEMV launch variant (" + names +
                                ")");
  }
  return from_env;
}

void launch_variant(int i, cudaStream_t s, const float* x, std::int64_t rows, std::int64_t in,
                    const std::uint16_t* w, std::int64_t out, const float* bias, float* y) {
  const gemv_variant& v = gemv_variants[i];
  const unsigned blocks = static_cast<unsigned>((out + v.warps - 1) / v.warps);
  launch_dependent("linear_bf16_kernel (16-byte loads)", v.kernel, dim3(blocks), dim3(32 * v.warps), 0, s,
                   x, rows, in, w, out, bias, y);
}

using shape_key = std::tuple<int, std::int64_t, std::int64_t>;  // device, in, out

std::mutex choices_mu;
std::map<shape_key, int> chosen;      ///< under choices_mu
std::vector<gemv_choice> seen;         ///< under choices_mu, in the order first seen

/// Microseconds per launch of each variant on this call's buffers: one
/// launch to warm up, then `reps` between two events.
std::vector<double> time_variants(cudaStream_t s, const float* x, std::int64_t rows, std::int64_t in,
                                  const std::uint16_t* w, std::int64_t out, const float* bias, float* y) {
  constexpr int reps = 5;
  cudaEvent_t start = nullptr, stop = nullptr;
  COROLLA_CUDA_CHECK(cudaEventCreate(&start));
  COROLLA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us(gemv_variant_count, 0.0);
  try {
    for (int i = 0; i < gemv_variant_count; ++i) {
      launch_variant(i, s, x, rows, in, w, out, bias, y);
      COROLLA_CUDA_CHECK(cudaEventRecord(start, s));
      for (int r = 0; r < reps; ++r) launch_variant(i, s, x, rows, in, w, out, bias, y);
      COROLLA_CUDA_CHECK(cudaEventRecord(stop, s));
      COROLLA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      us[static_cast<std::size_t>(i)] = 1000.0 * ms / reps;
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  COROLLA_CUDA_CHECK(cudaEventDestroy(start));
  COROLLA_CUDA_CHECK(cudaEventDestroy(stop));
  return us;
}

/// The variant for this shape: the default for more than one row; for one,
/// fixed by COROLLA_GEMV, chosen before, or timed now (the default while the
/// stream is being captured).
int variant_for(cudaStream_t s, const float* x, std::int64_t rows, std::int64_t in,
                const std::uint16_t* w, std::int64_t out, const float* bias, float* y) {
  if (rows != 1) return 0;
  const int fixed = fixed_variant();
  if (fixed >= 0 && forced_variant.load() >= 0) return fixed;  // a test's or benchmark's pick: not recorded
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  const shape_key key{device, in, out};
  std::lock_guard lock(choices_mu);
  if (auto it = chosen.find(key); it != chosen.end()) return it->second;
  gemv_choice c;
  c.device = device;
  c.in = in;
  c.out = out;
  if (fixed >= 0) {
    c.chosen = fixed;
  } else {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
    if (capture != cudaStreamCaptureStatusNone) return 0;  // no timing inside a graph; ask again later
    c.microseconds = time_variants(s, x, rows, in, w, out, bias, y);
    for (int i = 1; i < gemv_variant_count; ++i)
      if (c.microseconds[static_cast<std::size_t>(i)] < c.microseconds[static_cast<std::size_t>(c.chosen)])
        c.chosen = i;
  }
  chosen.emplace(key, c.chosen);
  seen.push_back(c);
  return c.chosen;
}

}  // namespace

std::vector<std::string> gemv_variant_names() {
  std::vector<std::string> names;
  for (const gemv_variant& v : gemv_variants) names.emplace_back(v.name);
  return names;
}

void set_gemv_variant(int index) {
  if (index < -1 || index >= gemv_variant_count)
    throw std::out_of_range("set_gemv_variant: " + std::to_string(index) + " is not -1 or a variant index below " +
                            std::to_string(gemv_variant_count));
  forced_variant.store(index);
}

std::vector<gemv_choice> gemv_choices() {
  std::lock_guard lock(choices_mu);
  return seen;
}

void linear_bf16_weight(stream_t s, const float* x, std::int64_t rows, std::int64_t in,
                        const void* w, std::int64_t out, const float* bias, float* y) {
  if (rows <= 0 || in <= 0 || out <= 0) return;
  const auto* wp = static_cast<const std::uint16_t*>(w);
  if (in % 8 == 0 && aligned16(x) && aligned16(w)) {
    launch_variant(variant_for(s, x, rows, in, wp, out, bias, y), s, x, rows, in, wp, out, bias, y);
  } else {
    const unsigned blocks = static_cast<unsigned>((out + scalar_warps - 1) / scalar_warps);
    launch_dependent("linear_bf16_kernel", gemv_scalar, dim3(blocks),
                     dim3(32 * scalar_warps), 0, s, x, rows, in, wp, out, bias, y);
  }
}

}  // namespace corolla::cuda
