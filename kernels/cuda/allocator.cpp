// kernels/cuda/allocator.cpp — the caching device allocator and the memory
// hooks it registers with the tensor layer (see allocator.hpp).
#include "kernels/cuda/allocator.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/tensor.hpp"

namespace corolla::cuda {
namespace {

constexpr std::size_t small_granule = 512;
constexpr std::size_t small_limit = std::size_t{1} << 20;  // 1 MiB
constexpr std::size_t large_granule = std::size_t{2} << 20;  // 2 MiB

/// One device's blocks. Guarded by `mutex`; cudaMalloc/cudaFree run under
/// it, which serialises allocation misses per device (they are rare).
struct device_cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;  ///< by size class
  std::unordered_map<void*, std::size_t> live;                      ///< block -> size class
  allocator_stats stats;
};

/// The caches of every device, created on first use and never destroyed:
/// tensors released during static destruction still return their blocks
/// here, and the CUDA runtime may already be gone by then (so the memory is
/// left to the driver at exit).
device_cache& cache_for(int index) {
  static std::mutex registry_mutex;
  static auto* caches = new std::unordered_map<int, std::unique_ptr<device_cache>>();
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& c = (*caches)[index];
  if (!c) c = std::make_unique<device_cache>();
  return *c;
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void check_device_index(int index) {
  const int n = device_count();
  if (n == 0)
    throw std::runtime_error("cuda:" + std::to_string(index) +
                             ": cannot allocate device memory: no CUDA device is visible (" +
                             device_count_error() + ")");
  if (index < 0 || index >= n)
    throw std::runtime_error("cuda:" + std::to_string(index) +
                             ": cannot allocate device memory: only " + std::to_string(n) +
                             " CUDA device(s) are visible");
}

/// cudaFree of every cached block; caller holds c.mutex and a device_guard.
/// A block leaves the list before it is freed, so a cudaFree that throws
/// leaves no freed block behind to be handed out again.
void free_cached_locked(device_cache& c) {
  for (auto it = c.free_blocks.begin(); it != c.free_blocks.end(); it = c.free_blocks.erase(it)) {
    auto& [cls, blocks] = *it;
    while (!blocks.empty()) {
      void* p = blocks.back();
      blocks.pop_back();
      c.stats.cached -= cls;
      COROLLA_CUDA_CHECK(cudaFree(p));
    }
  }
}

constexpr int max_capture_devices = 64;
/// Per device: steps being captured now (set_capture_underway).
std::atomic<int> captures_underway[max_capture_devices] = {};

bool capture_underway(int index) {
  return index >= 0 && index < max_capture_devices && captures_underway[index].load() > 0;
}

// ---- hooks registered with the tensor layer --------------------------------------

void* hook_allocate(std::size_t bytes, int index) { return device_allocate(bytes, index); }

void hook_release(void* p, int index) noexcept { device_release(p, index); }

void hook_fill_zero(void* p, std::size_t bytes, int index) {
  device_guard guard(index);
  // Legacy default stream: ordered after the (blocking) backend stream's work.
  COROLLA_CUDA_CHECK(cudaMemset(p, 0, bytes));
}

void hook_copy(void* dst, device dst_dev, const void* src, device src_dev, std::size_t bytes) {
  const int index = dst_dev.kind == device_kind::cuda ? dst_dev.index : src_dev.index;
  device_guard guard(index);
  // cudaMemcpyDefault: the direction follows from the pointers (unified
  // addressing). A copy to pageable host memory returns when it is complete.
  COROLLA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

}  // namespace

void set_capture_underway(int index, bool on) {
  if (index < 0 || index >= max_capture_devices) return;
  if (on)
    ++captures_underway[index];
  else
    --captures_underway[index];
}

std::size_t size_class(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= small_limit) return (bytes + small_granule - 1) / small_granule * small_granule;
  return (bytes + large_granule - 1) / large_granule * large_granule;
}

void* device_allocate(std::size_t bytes, int index) {
  check_device_index(index);
  const std::size_t cls = size_class(bytes);
  device_cache& c = cache_for(index);
  std::lock_guard<std::mutex> lock(c.mutex);
  void* p = nullptr;
  auto it = c.free_blocks.find(cls);
  if (it != c.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    c.stats.cached -= cls;
  } else {
    device_guard guard(index);
    cudaError_t status = cudaMalloc(&p, cls);
    const std::size_t cached_before = c.stats.cached;
    if (status == cudaErrorMemoryAllocation && capture_underway(index)) {
      cudaGetLastError();
      char msg[200];
      std::snprintf(msg, sizeof msg,
                    "cuda:%d out of memory allocating %.1f MiB while a step was being captured (it runs again "
                    "without a graph, where the cache is released and the allocation retried)",
                    index, mib(cls));
      throw cuda_out_of_memory(msg);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it; the retry decides
      free_cached_locked(c);
      status = cudaMalloc(&p, cls);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      char msg[320];
      std::snprintf(msg, sizeof msg,
                    "cuda:%d out of memory allocating %.1f MiB (%.1f MiB in use, %.1f MiB "
                    "cached; the cache was released and the allocation retried; the device "
                    "reports %.1f MiB free of %.1f MiB)",
                    index, mib(cls), mib(c.stats.in_use), mib(cached_before), mib(free_b),
                    mib(total_b));
      throw cuda_out_of_memory(msg);
    }
    if (status != cudaSuccess) throw_cuda_error(status, "cudaMalloc", __FILE__, __LINE__);
    ++c.stats.device_mallocs;
  }
  c.live[p] = cls;
  c.stats.in_use += cls;
  if (c.stats.in_use > c.stats.peak_in_use) c.stats.peak_in_use = c.stats.in_use;
  return p;
}

void device_release(void* p, int index) noexcept {
  if (!p) return;
  try {
    device_cache& c = cache_for(index);
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.live.find(p);
    if (it == c.live.end()) {
      std::fprintf(stderr, "corolla: cuda:%d: release of a block this allocator did not hand out\n",
                   index);
      return;
    }
    const std::size_t cls = it->second;
    c.live.erase(it);
    c.stats.in_use -= cls;
    c.free_blocks[cls].push_back(p);
    c.stats.cached += cls;
  } catch (...) {
    // bad_alloc growing a free list: the block is leaked, never a throw from a destructor
  }
}

void release_cached(int index) {
  device_cache& c = cache_for(index);
  std::lock_guard<std::mutex> lock(c.mutex);
  device_guard guard(index);
  free_cached_locked(c);
}

allocator_stats stats(int index) {
  device_cache& c = cache_for(index);
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void install_memory_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    device_memory_ops ops;
    ops.allocate = hook_allocate;
    ops.release = hook_release;
    ops.fill_zero = hook_fill_zero;
    ops.copy = hook_copy;
    register_device_memory(device_kind::cuda, ops);
  });
}

}  // namespace corolla::cuda
