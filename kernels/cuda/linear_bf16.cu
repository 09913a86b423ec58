// kernels/cuda/linear_bf16.cu — linear with a bf16 weight and f32
// activations: a GEMV-style kernel, one warp per output feature.
//
// Batch-1 decode is bound by reading the weights; each warp streams one
// weight row once per pass (8 bf16 per lane per 16-byte load), widens them
// to f32 in registers (a bf16 is the upper half of an f32) and keeps one
// f32 accumulator per row of the pass, reduced across the warp with
// shuffles at the end. The bias is added by lane 0 as it writes.
//
// Launch variants (linear_bf16_variants.cuh: the register, pipelined,
// cp.async, split and several-output kernels; loads in flight per
// lane x warps per block x warps per output x outputs per warp) all sum an
// output's products in the same lanes, classes and order (gemv_classes),
// so they give bit-identical results and the fastest can be picked per
// weight shape by timing, with no effect on what decode computes
// (linear_bf16.hpp). The kernel is an
// early-launch dependent (grid_dependency.cuh): it asks L2 for its weight
// row while the norm, attention or activation before it finishes.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/linear_bf16.hpp"
#include "kernels/cuda/linear_bf16_rope_kv_kernels.cuh"
#include "kernels/cuda/linear_bf16_variants.cuh"

namespace corolla::cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// The COROLLA_GEMV setting when it names no variant: "all" (the tuner may
/// choose every variant, the untuned too, gemv_variant::tuned), "nosplit"
/// (the tuned variants but the split kernel's: the A/B for its shared
/// memory), or "" (auto, the default).
const std::string& tune_setting() {
  static const std::string setting = [] {
    const char* env = std::getenv("COROLLA_GEMV");
    const std::string s = env ? env : "";
    return s == "all" || s == "nosplit" ? s : std::string();
  }();
  return setting;
}

/// Whether the tuner may choose variant i under COROLLA_GEMV.
bool may_choose(int i) {
  const gemv_variant& v = gemv_variants[i];
  if (tune_setting() == "all") return true;
  return v.tuned && !(tune_setting() == "nosplit" && v.split > 1);
}

/// The variant set_gemv_variant fixed, or -1: COROLLA_GEMV decides.
std::atomic<int> forced_variant{-1};

/// -1 for auto (time the variants), else the fixed index: set_gemv_variant's
/// or COROLLA_GEMV's. Throws for a COROLLA_GEMV that names no variant.
int fixed_variant() {
  if (const int forced = forced_variant.load(); forced >= 0) return forced;
  static const char* const env = std::getenv("COROLLA_GEMV");
  static const int from_env = [] {
    if (env == nullptr || *env == '\0' || std::string(env) == "auto" || !tune_setting().empty()) return -1;
    for (int i = 0; i < gemv_variant_count; ++i)
      if (std::string(env) == gemv_variants[i].name) return i;
    return -2;
  }();
  if (from_env == -2) {
    std::string names = "auto, all, nosplit";
    for (const gemv_variant& c : gemv_variants) names += std::string(", ") + c.name;
    throw std::invalid_argument("COROLLA_GEMV=" + std::string(env) + ": not a GEMV launch variant (" + names +
                                ")");
  }
  return from_env;
}

/// One GEMV launch: variant i (gemv_variants) or the scalar kernel (i < 0),
/// epilogue e.
struct gemv_call {
  cudaStream_t s;
  const float* x;
  std::int64_t rows, in;
  const std::uint16_t* w;
  std::int64_t out;
  const float* bias;
  const float* residual;
  float* y;
  gemv_epilogue e;
};

template <gemv_epilogue E>
gemv_kernel kernel_of(int i) {
  return i < 0 ? gemv_scalar<E> : gemv_kernel_for<E>(i);
}

void launch(int i, const gemv_call& c) {
  gemv_kernel k = nullptr;
  switch (c.e) {
    case gemv_epilogue::bias: k = kernel_of<gemv_epilogue::bias>(i); break;
    case gemv_epilogue::residual: k = kernel_of<gemv_epilogue::residual>(i); break;
    case gemv_epilogue::gelu: k = kernel_of<gemv_epilogue::gelu>(i); break;
    case gemv_epilogue::swiglu: k = kernel_of<gemv_epilogue::swiglu>(i); break;
  }
  const int warps = i < 0 ? scalar_warps : gemv_variants[i].warps;
  const std::size_t smem = i < 0 ? 0 : gemv_smem_bytes(gemv_variants[i]);
  const unsigned blocks =
      static_cast<unsigned>(i < 0 ? (c.out + warps - 1) / warps : gemv_blocks(gemv_variants[i], c.out));
  const char* name = i < 0                          ? "linear_bf16_kernel"
                     : smem                         ? "linear_bf16_async_kernel"
                     : gemv_variants[i].split > 1 ? "linear_bf16_split_kernel"
                                                    : "linear_bf16_kernel (16-byte loads)";
  launch_dependent(name, k, dim3(blocks), dim3(32 * warps), smem, c.s, c.x, c.rows, c.in, c.w, c.out, c.bias,
                   c.residual, c.y);
}

using shape_key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t>;  // device, in, out, rows of x

std::mutex choices_mu;
std::map<shape_key, int> chosen;      ///< under choices_mu
std::vector<gemv_choice> seen;         ///< under choices_mu, in the order first seen

/// Frees what timing allocated, on every path out.
struct timing_resources {
  cudaStream_t s = nullptr;
  std::vector<cudaEvent_t> events;
  void* scratch = nullptr;
  void* flush = nullptr;
  ~timing_resources() {
    if (scratch) cudaFreeAsync(scratch, s);
    if (flush) cudaFreeAsync(flush, s);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  cudaEvent_t event() {
    cudaEvent_t e = nullptr;
    COROLLA_CUDA_CHECK(cudaEventCreate(&e));
    events.push_back(e);
    return e;
  }
};

/// Microseconds of one launch of each variant of `candidates` (NaN for the
/// others; empty when the memory for timing cannot be had): `rows` rows of
/// x, weight rows [rows_w, in], the plain epilogue, into a scratch output
/// of its own (the call's y may be its residual). Decode reads its weights
/// from HBM, not from L2 (the other layers' weights pass through in
/// between), so every timed launch
/// follows a write over twice L2's size; the variants take turns over
/// `rounds` rounds (clock ramps and drift hit all alike) and each keeps its
/// fastest launch.
std::vector<double> time_variants(cudaStream_t s, const float* x, std::int64_t rows, std::int64_t in,
                                  const std::uint16_t* w, std::int64_t rows_w, const std::vector<int>& candidates) {
  constexpr int rounds = 5;
  int device = 0, l2 = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  const std::size_t flush_bytes = 2 * static_cast<std::size_t>(l2 > 0 ? l2 : 64 << 20);
  timing_resources r;
  r.s = s;
  // Outside the caching allocator, and not worth failing a decode step for:
  // without the memory, no timing (the caller keeps the default).
  if (cudaMallocAsync(&r.scratch, sizeof(float) * static_cast<std::size_t>(rows * rows_w), s) != cudaSuccess ||
      cudaMallocAsync(&r.flush, flush_bytes, s) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  const gemv_call c{s, x, rows, in, w, rows_w, nullptr, nullptr, static_cast<float*>(r.scratch), gemv_epilogue::bias};
  const int n = static_cast<int>(candidates.size());
  std::vector<cudaEvent_t> start, stop;
  for (int i = 0; i < n * rounds; ++i) {
    start.push_back(r.event());
    stop.push_back(r.event());
  }
  for (int v : candidates) launch(v, c);  // warm-up: code loaded, clocks up
  for (int round = 0; round < rounds; ++round)
    for (int i = 0; i < n; ++i) {
      const auto at = static_cast<std::size_t>(round * n + i);
      COROLLA_CUDA_CHECK(cudaMemsetAsync(r.flush, round & 1, flush_bytes, s));
      COROLLA_CUDA_CHECK(cudaEventRecord(start[at], s));
      launch(candidates[static_cast<std::size_t>(i)], c);
      COROLLA_CUDA_CHECK(cudaEventRecord(stop[at], s));
    }
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us(gemv_variant_count, std::numeric_limits<double>::quiet_NaN());
  for (int round = 0; round < rounds; ++round)
    for (int i = 0; i < n; ++i) {
      const auto at = static_cast<std::size_t>(round * n + i);
      float ms = 0;
      COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start[at], stop[at]));
      double& best = us[static_cast<std::size_t>(candidates[static_cast<std::size_t>(i)])];
      best = std::isnan(best) ? 1000.0 * ms : std::min(best, 1000.0 * ms);
    }
  return us;
}

/// A variant other than the default is kept only if it is faster by this
/// fraction: timing noise alone should not move decode off the kernel whose
/// speed was measured.
constexpr double keep_default_within = 0.03;

/// Calls of more rows are not tuned (gemm.cpp widens the weight above 16).
constexpr std::int64_t max_tuned_rows = 16;

std::set<shape_key> timing;  ///< under choices_mu: shapes a thread is timing now

/// The variant for a call. One row: fixed (set_gemv_variant, COROLLA_GEMV),
/// chosen before for its weight shape, or timed now (every variant; the
/// fastest the tuner may choose, may_choose). Several (up to
/// max_tuned_rows; the default above): under a fixed variant that variant
/// if it has several rows per pass, else the default; otherwise chosen
/// before for the shape and that number of rows, or timed now among the
/// variants of several rows per pass (gemv_variant::rows; a server's
/// batch of sessions).
/// The default, untimed: while the stream is being captured into a graph, or another thread times the shape (both ask again
/// next time); under COROLLA_CUDA_SYNC (every launch would time a host
/// round trip) or when timing's memory cannot be had (both recorded). The
/// lock is not held while timing: other threads' GEMVs go on.
int variant_for(const gemv_call& c) {
  const bool many = c.rows != 1;
  if (c.rows > max_tuned_rows) return 0;  // prefill-sized: linear_bf16_weight's callers widen the weight instead
  const int fixed = fixed_variant();
  if (many && fixed >= 0) return gemv_variants[fixed].rows > 1 ? fixed : 0;  // fixed: untimed, not recorded
  if (!many && fixed >= 0 && forced_variant.load() >= 0) return fixed;      // a test's or benchmark's pick: not recorded
  const std::int64_t rows_w = c.e == gemv_epilogue::swiglu ? 2 * c.out : c.out;
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  const shape_key key{device, c.in, rows_w, c.rows};
  {
    std::lock_guard lock(choices_mu);  // the common case: chosen before
    if (auto it = chosen.find(key); it != chosen.end()) return it->second;
  }
  const bool time_it = fixed < 0 && !sync_after_launch();
  if (time_it) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    COROLLA_CUDA_CHECK(cudaStreamIsCapturing(c.s, &capture));
    if (capture != cudaStreamCaptureStatusNone) return 0;  // no timing inside a graph
  }
  {
    std::lock_guard lock(choices_mu);
    if (auto it = chosen.find(key); it != chosen.end()) return it->second;  // chosen meanwhile
    if (time_it && !timing.insert(key).second) return 0;                    // another thread is timing it
  }
  gemv_choice choice;
  choice.device = device;
  choice.in = c.in;
  choice.out = rows_w;
  choice.rows = c.rows;
  if (fixed >= 0) choice.chosen = fixed;
  // The candidates: every variant for one row (the untuned timed for the
  // record), those of several rows per pass for more.
  std::vector<int> candidates;
  for (int i = 0; i < gemv_variant_count; ++i)
    if (!many || gemv_variants[i].rows > 1) candidates.push_back(i);
  if (time_it) {
    try {
      choice.microseconds = time_variants(c.s, c.x, c.rows, c.in, c.w, rows_w, candidates);
    } catch (...) {
      std::lock_guard lock(choices_mu);
      timing.erase(key);
      throw;
    }
    const std::vector<double>& us = choice.microseconds;
    if (!us.empty()) {
      for (int i : candidates)  // untuned variants are timed for the record only (NaN: not timed)
        if (i > 0 && may_choose(i) && us[static_cast<std::size_t>(i)] < us[static_cast<std::size_t>(choice.chosen)])
          choice.chosen = i;
      if (us[static_cast<std::size_t>(choice.chosen)] > (1.0 - keep_default_within) * us[0]) choice.chosen = 0;
    }
  }
  std::lock_guard lock(choices_mu);
  timing.erase(key);
  const auto [it, fresh] = chosen.emplace(key, choice.chosen);  // two threads fixed by COROLLA_GEMV may race
  if (fresh) seen.push_back(choice);
  return it->second;
}

}  // namespace

std::vector<std::string> gemv_variant_names() {
  std::vector<std::string> names;
  for (const gemv_variant& v : gemv_variants) names.emplace_back(v.name);
  return names;
}

bool gemv_variant_tuned(int index) { return index >= 0 && index < gemv_variant_count && may_choose(index); }

void check_gemv_setting() {
  (void)fixed_variant();
  (void)carveout_setting();
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

void linear_bf16_rope_kv(stream_t s, const float* x, std::int64_t in, const void* w, const float* bias, float* q,
                         const std::int32_t* positions, int hq, int hkv, int head_dim, const rope_spec& spec,
                         bool rotate, elem cache, void* k_out, void* v_out) {
  const std::int64_t pairs = (std::int64_t{hq} + 2 * std::int64_t{hkv}) * (head_dim / 2);
  if (pairs <= 0 || in <= 0) return;
  const unsigned blocks = static_cast<unsigned>((pairs + rope_kv_warps - 1) / rope_kv_warps);
  dispatch_elem(cache, [&](auto tag) {
    using KT = decltype(tag);
    const rope_kv_rows<KT> d{q,       positions, hq, hkv, head_dim, spec, rotate, static_cast<KT*>(k_out),
                             static_cast<KT*>(v_out)};
    launch_dependent("linear_bf16_rope_kv_kernel", &linear_bf16_rope_kv_kernel<rope_kv_unroll, rope_kv_warps, KT>,
                     dim3(blocks), dim3(32 * rope_kv_warps), 0, s, x, in, static_cast<const std::uint16_t*>(w), bias,
                     d);
  });
}

void linear_bf16_weight(stream_t s, const float* x, std::int64_t rows, std::int64_t in, const void* w,
                        std::int64_t out, const float* bias, float* y, gemv_epilogue e, const float* residual) {
  if (rows <= 0 || in <= 0 || out <= 0) return;
  const gemv_call c{s, x, rows, in, static_cast<const std::uint16_t*>(w), out, bias, residual, y, e};
  launch(in % 8 == 0 && aligned16(x) && aligned16(w) ? variant_for(c) : -1, c);
}

}  // namespace corolla::cuda
