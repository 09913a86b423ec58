// kernels/cuda/launch_dependent.cuh — launching a kernel as a programmatic
// dependent of the kernel before it in the stream (grid_dependency.cuh says
// what the kernel must do). Host side; included only by .cu files (C++17).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device.hpp"

namespace corolla::cuda {

/// Whether `kernel` was compiled for compute_90 or later (as run on device
/// `device`, the current one), so its
/// griddepcontrol instructions are in it: PTX for an older virtual
/// architecture, JIT-compiled for a newer GPU, has them compiled out
/// (ptxVersion, not binaryVersion, which is the GPU's). Cached.
inline bool has_grid_dependency(const void* kernel, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> known;
  std::lock_guard lock(mu);
  auto [it, fresh] = known.try_emplace({kernel, device}, false);
  if (fresh) {
    cudaFuncAttributes attr{};
    COROLLA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    it->second = attr.ptxVersion >= 90;
  }
  return it->second;
}

/// COROLLA_CUDA_CARVEOUT=<0-100>: the shared-memory share of L1 (percent)
/// every early-launchable kernel asks for, so that kernels of different
/// shared-memory needs run under one configuration and may share a
/// multiprocessor (an SM changes its split only when idle). -1 (unset): the
/// driver picks per kernel. Anything else throws.
inline int carveout_setting() {
  static const int percent = [] {
    const char* env = std::getenv("COROLLA_CUDA_CARVEOUT");
    if (env == nullptr || *env == '\0') return -1;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > 100)
      throw std::invalid_argument(std::string("COROLLA_CUDA_CARVEOUT=") + env + ": not a percentage from 0 to 100");
    return static_cast<int>(v);
  }();
  return percent;
}

/// Sets carveout_setting() on `kernel` for the current device, once.
inline void apply_carveout(const void* kernel) {
  const int percent = carveout_setting();
  if (percent < 0) return;
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  std::lock_guard lock(mu);
  if (done.emplace(kernel, device).second)
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
}

/// Launches kernel<<<grid, threads, smem, s>>>(args...), and where
/// early_launch_active() (device.hpp) and the kernel's binary has the wait
/// (has_grid_dependency) with the programmatic stream serialisation
/// attribute, so it may be scheduled while the previous kernel finishes.
/// The kernel must call await_producers() before it reads or writes
/// anything an earlier kernel may touch. `name` is for errors.
template <class... Params, class... Args>
void launch_dependent(const char* name, void (*kernel)(Params...), dim3 grid, dim3 threads,
                      std::size_t smem, cudaStream_t s, Args... args) {
  apply_carveout(reinterpret_cast<const void*>(kernel));
  bool early = false;
  if (early_launch_requested()) {  // as early_launch_active(), asking for the device once
    int device = 0;
    COROLLA_CUDA_CHECK(cudaGetDevice(&device));
    early = early_launch_supported(device) && has_grid_dependency(reinterpret_cast<const void*>(kernel), device);
  }
  if (early) {
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = threads;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t status = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // clear it, so the next check does not report it again
      throw_cuda_error(status, name, __FILE__, __LINE__);
    }
  } else {
    kernel<<<grid, threads, smem, s>>>(args...);
  }
  check_launch(name, __FILE__, __LINE__);
}

}  // namespace corolla::cuda
