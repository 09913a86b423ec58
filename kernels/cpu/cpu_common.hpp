// kernels/cpu/cpu_common.hpp — what every CPU op file shares: shape checks
// that never allocate, the serial-or-parallel loop policy, per-thread
// scratch, and the two vector primitives (dot, axpy) the loops are built on.
//
// Internal to kernels/cpu; compiled with OpenMP.
#pragma once

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/tensor.hpp"

namespace corolla::cpu {

// ---- checks ------------------------------------------------------------------

/// Throws tensor_error naming `what` unless `t` is a defined host tensor of
/// dtype `type` and shape exactly `dims`. Allocates nothing unless it throws
/// (the decode hot path calls it on every op).
void require(const Tensor& t, dtype type, std::initializer_list<std::int64_t> dims,
             const char* what);
/// Same, with the expected shape taken from `like` (elementwise operands).
void require_like(const Tensor& t, dtype type, const Tensor& like, const char* what);
/// Throws tensor_error naming `what` unless `t` is a defined host tensor of
/// dtype `type` (any shape).
void require_host(const Tensor& t, dtype type, const char* what);
/// Throws tensor_error with `what` + ": " + `detail` when `ok` is false.
void require_that(bool ok, const char* what, const char* detail);

// ---- loop policy ----------------------------------------------------------------

/// Element-operations below which a loop runs on the calling thread: an
/// OpenMP fork/join costs a few microseconds, as much as ~30k multiply-adds,
/// and the batch-1 decode ops (one row of a norm, one token's rope) are
/// far smaller than that.
inline constexpr std::int64_t serial_work_limit = 1 << 15;

/// Threads the backend may use (set_cpu_threads), at least 1.
int thread_budget();

/// Threads to use for `items` independent items totalling `work`
/// element-operations: 1 below serial_work_limit, else up to the budget.
inline int threads_for(std::int64_t items, std::int64_t work) {
  if (work < serial_work_limit || items < 2) return 1;
  int t = thread_budget();
  return items < t ? static_cast<int>(items) : t;
}

/// Runs body(i) for i in [0, items), in parallel (static schedule) when the
/// total work (items * work_per_item) is worth a fork. body must not throw.
template <class F>
void parallel_for(std::int64_t items, std::int64_t work_per_item, F&& body) {
  int t = threads_for(items, items * work_per_item);
  if (t <= 1) {
    for (std::int64_t i = 0; i < items; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(t) schedule(static)
  for (std::int64_t i = 0; i < items; ++i) body(i);
}

/// Like parallel_for but hands out items dynamically in chunks of `chunk`:
/// for items of very unequal cost (causal attention rows).
template <class F>
void parallel_for_dynamic(std::int64_t items, std::int64_t total_work, int chunk, F&& body) {
  int t = threads_for(items, total_work);
  if (t <= 1) {
    for (std::int64_t i = 0; i < items; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(t) schedule(dynamic, chunk)
  for (std::int64_t i = 0; i < items; ++i) body(i);
}

/// Splits [0, n) into one contiguous range per thread (boundaries on
/// 16-element = 64-byte multiples, so threads never share a cache line of
/// output) and runs body(begin, end) on each. Serial below the work limit.
template <class F>
void parallel_ranges(std::int64_t n, std::int64_t work_per_element, F&& body) {
  int t = threads_for(n / 16, n * work_per_element);
  if (t <= 1) {
    if (n > 0) body(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    std::int64_t blocks = (n + 15) / 16;
    std::int64_t id = omp_get_thread_num(), nt = omp_get_num_threads();
    std::int64_t b0 = blocks * id / nt, b1 = blocks * (id + 1) / nt;
    std::int64_t begin = b0 * 16, end = b1 * 16 < n ? b1 * 16 : n;
    if (begin < end) body(begin, end);
  }
}

// ---- scratch -------------------------------------------------------------------

/// At least `n` floats of scratch private to the calling thread; `slot`
/// (0..3) tells apart buffers an op needs at the same time. A buffer grows
/// (allocates) only when its thread first needs more than before, so steady
/// state decode and training loops allocate nothing. Contents are garbage.
float* thread_scratch(int slot, std::size_t n);
/// The same for doubles (one slot).
double* thread_scratch_f64(std::size_t n);

// ---- streaming weights ---------------------------------------------------------

/// How far ahead of the row being read the one-row decode kernels (bf16,
/// int8, nf4) ask for the weight bytes they will read next. Their loops
/// stream rows of about a kilobyte, each ending in a reduction, and the
/// hardware prefetcher alone left them at about half the memory bandwidth
/// a plain read sweep gets; 8 KiB ahead (a few rows) measured best on the
/// bench model (docs/benchmarks.md, 2026-11-30).
inline constexpr std::size_t weight_prefetch_distance = 8192;

/// Prefetch hints for the `bytes` that lie weight_prefetch_distance past
/// `p` (one per cache line): called for each weight row as its read
/// begins. Hints never fault, past the end of the weights included.
inline void prefetch_ahead(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p) + weight_prefetch_distance;
  for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

// ---- vector primitives ---------------------------------------------------------

/// sum a[i] * b[i] in f32 (vectorised, so summed in lane-wise partials).
inline float dot(const float* a, const float* b, std::int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// sum a[i] * b[i] in 32 independent f32 partial sums (four 8-lane FMA
/// chains that pipeline, where dot()'s one chain waits on each FMA's
/// latency), as a call: for the loops that take many dot products inside a
/// parallel region's lambda (one per row against a weight row widened into
/// scratch), where GCC 12 inlines dot() and leaves its reduction scalar.
/// 4x-8x faster there (`corolla bench serve --weights bf16` with 4 sessions
/// found the scalar chain).
[[gnu::noinline]] inline float dot_pipelined(const float* a, const float* b, std::int64_t n) {
  float part[32] = {};
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 32; ++l) part[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < 32; ++l) s += part[l];
  return s;
}

/// y[i] += alpha * x[i].
inline void axpy(float alpha, const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace corolla::cpu
