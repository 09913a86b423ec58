// kernels/cpu/cpu_backend.cpp — the CPU backend's registry, thread budget,
// shared checks and scratch, tensor creation and host copies.
#include "kernels/cpu/cpu_backend.hpp"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_common.hpp"
#include "kernels/half.hpp"
#include "kernels/op_checks.hpp"

namespace corolla {
namespace cpu {
namespace {

// 0 = not chosen yet: the first reader takes OpenMP's default, which honours
// OMP_NUM_THREADS and otherwise is the number of hardware threads. Kept here
// rather than only in OpenMP's per-thread ICV because ops may be called from
// threads other than the one that called set_cpu_threads; every parallel
// region passes it explicitly with num_threads().
std::atomic<int> g_threads{0};

}  // namespace

int thread_budget() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  n = omp_get_max_threads();
  if (n < 1) n = 1;
  int expected = 0;
  g_threads.compare_exchange_strong(expected, n);
  return g_threads.load(std::memory_order_relaxed);
}

// The checks are the shared ones (kernels/op_checks.hpp) with the host as
// the device.
void require_host(const Tensor& t, dtype type, const char* what) {
  require_on(t, device{}, type, what);
}

void require(const Tensor& t, dtype type, std::initializer_list<std::int64_t> dims,
             const char* what) {
  require_on(t, device{}, type, dims, what);
}

void require_like(const Tensor& t, dtype type, const Tensor& like, const char* what) {
  require_like_on(t, device{}, type, like, what);
}

void require_that(bool ok, const char* what, const char* detail) {
  require_condition(ok, what, detail);
}

float* thread_scratch(int slot, std::size_t n) {
  thread_local std::vector<float> buffers[4];
  if (slot < 0 || slot >= 4) throw tensor_error("thread_scratch: slot out of range");
  std::vector<float>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

double* thread_scratch_f64(std::size_t n) {
  thread_local std::vector<double> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// ---- tensors and copies ---------------------------------------------------------

Tensor cpu_backend_impl::empty(shape_t shape, dtype t) {
  return Tensor::empty(std::move(shape), t, device{});
}

void cpu_backend_impl::copy(const Tensor& src, Tensor& dst) {
  if (!src.defined() || !dst.defined()) throw tensor_error("copy: tensor is undefined");
  if (src.dev().kind != device_kind::cpu || dst.dev().kind != device_kind::cpu)
    throw tensor_error("copy: the cpu backend copies between host tensors only (got " +
                       src.dev().str() + " -> " + dst.dev().str() +
                       "); use the device's backend");
  if (src.numel() != dst.numel())
    throw tensor_error("copy: " + shape_str(src.shape()) + " into " + shape_str(dst.shape()) +
                       " (element counts differ)");
  const dtype from = src.type(), to = dst.type();
  if (from == to) {
    if (src.raw() != dst.raw()) std::memmove(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  auto is_float = [](dtype t) { return t == dtype::f32 || t == dtype::bf16 || t == dtype::f16; };
  if (!is_float(from) || !is_float(to))
    throw tensor_error(std::string("copy: cannot convert ") + dtype_name(from) + " to " +
                       dtype_name(to));
  const auto n = src.numel();
  parallel_ranges(n, 4, [&](std::int64_t b, std::int64_t e) {
    auto count = static_cast<std::size_t>(e - b);
    const auto* s16 = static_cast<const std::uint16_t*>(src.raw()) + b;
    auto* d16 = static_cast<std::uint16_t*>(dst.raw()) + b;
    if (from == dtype::f32) {
      const float* s = static_cast<const float*>(src.raw()) + b;
      if (to == dtype::bf16)
        f32_to_bf16(s, d16, count);
      else
        f32_to_f16(s, d16, count);
    } else if (to == dtype::f32) {
      float* d = static_cast<float*>(dst.raw()) + b;
      if (from == dtype::bf16)
        bf16_to_f32(s16, d, count);
      else
        f16_to_f32(s16, d, count);
    } else {  // bf16 <-> f16 through f32 (exact widening, one rounding)
      for (std::size_t i = 0; i < count; ++i) {
        float f = from == dtype::bf16 ? bf16_to_f32(s16[i]) : f16_to_f32(s16[i]);
        d16[i] = to == dtype::bf16 ? f32_to_bf16(f) : f32_to_f16(f);
      }
    }
  });
}

}  // namespace cpu

// ---- registry ----------------------------------------------------------------------

Backend& cpu_backend() {
  static cpu::cpu_backend_impl instance;
  return instance;
}

int cpu_threads() { return cpu::thread_budget(); }

void set_cpu_threads(int n) {
  if (n < 1) throw std::invalid_argument("cpu threads must be at least 1, got " + std::to_string(n));
  cpu::g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
  // OpenBLAS stays at one thread: products are split over the OpenMP
  // threads (see kernels/cpu/cpu_gemm.cpp), so n sizes the only pool.
}

}  // namespace corolla
