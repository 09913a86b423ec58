#include "kernels/cuda/device.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/check.hpp"

namespace corolla::cuda {

namespace {
cudaError_t query(int* n) {
  static int count = -1;
  static cudaError_t status = cudaSuccess;
  if (count < 0) {
    status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) count = 0;
  }
  *n = count;
  return status;
}
}  // namespace

int device_count() {
  int n = 0;
  query(&n);
  return n;
}

std::string device_count_error() {
  int n = 0;
  cudaError_t e = query(&n);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return n == 0 ? "no CUDA-capable device" : "";
}

std::string device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "unavailable";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %.0f GiB, sm_%d%d", p.name,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.major,
                p.minor);
  return buf;
}

std::pair<std::size_t, std::size_t> device_memory(int index) {
  device_guard guard(index);
  std::size_t free_b = 0, total_b = 0;
  COROLLA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {free_b, total_b};
}

// ---- allow_smem's record (device_math.cuh) ------------------------------------------

namespace {
std::mutex smem_mu;
std::map<std::pair<const void*, int>, std::size_t> smem_allowed;  ///< (kernel, device) -> bytes
}  // namespace

void allow_smem_for(const void* kernel, std::size_t bytes) {
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard lock(smem_mu);
  std::size_t& allowed = smem_allowed[{kernel, device}];
  if (allowed >= bytes) return;
  COROLLA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  allowed = bytes;
}

// ---- early launch (device.hpp) -----------------------------------------------------

namespace {
std::atomic<bool>& early_launch_flag() {
  static std::atomic<bool> on{env_switch("COROLLA_CUDA_EARLY_LAUNCH", true)};
  return on;
}
constexpr int max_devices = 64;
/// Per device: 0 not yet asked, 1 below sm_90, 2 sm_90 or later.
std::atomic<int> device_has_pdl[max_devices] = {};
}  // namespace

void set_early_launch(bool on) { early_launch_flag().store(on); }

bool early_launch_requested() { return early_launch_flag().load(); }

bool early_launch_supported(int index) {
  if (index < 0 || index >= max_devices) return false;
  std::atomic<int>& known = device_has_pdl[index];
  int has = known.load(std::memory_order_relaxed);
  if (has == 0) {
    int major = 0;
    COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
    has = major >= 9 ? 2 : 1;
    known.store(has, std::memory_order_relaxed);
  }
  return has == 2;
}

bool early_launch_active() {
  if (!early_launch_requested()) return false;
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  return early_launch_supported(device);
}

}  // namespace corolla::cuda
