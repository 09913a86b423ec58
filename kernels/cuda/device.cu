#include "kernels/cuda/device.hpp"

#include <cuda_runtime.h>

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

}  // namespace corolla::cuda
