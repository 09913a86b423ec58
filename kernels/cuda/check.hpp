// kernels/cuda/check.hpp — status checks for every CUDA runtime and cuBLAS
// call: a failure throws std::runtime_error naming the call, file:line and
// the library's own description of the status. Internal to kernels/cuda
// (included by .cpp and .cu files alike; C++17).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/device.hpp"

namespace corolla::cuda {

/// Throws std::runtime_error("CUDA error: <call> at <file>:<line>: <name>: <description>").
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
/// Throws std::runtime_error("cuBLAS error: <call> at <file>:<line>: <status string>").
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);
/// After a kernel launch: throws for a launch error (bad configuration, no
/// device, an earlier asynchronous fault). With COROLLA_CUDA_SYNC=1 in the
/// environment it also synchronises the device, so an asynchronous fault is
/// reported at the kernel that caused it instead of at a later call.
void check_launch(const char* kernel, const char* file, int line);
// sync_after_launch() (COROLLA_CUDA_SYNC) is in device.hpp.

/// Makes `index` the calling thread's current device for its lifetime and
/// restores the previous one afterwards (CUDA's current device is per thread,
/// and ops may be called from any thread).
class device_guard {
 public:
  explicit device_guard(int index);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = -1;
  int index_ = -1;
};

}  // namespace corolla::cuda

/// Evaluates a cudaError_t-returning call; throws with context unless it succeeded.
#define COROLLA_CUDA_CHECK(call)                                                   \
  do {                                                                             \
    const cudaError_t corolla_status_ = (call);                                    \
    if (corolla_status_ != cudaSuccess)                                            \
      ::corolla::cuda::throw_cuda_error(corolla_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Evaluates a cublasStatus_t-returning call; throws with context unless it succeeded.
#define COROLLA_CUBLAS_CHECK(call)                                                   \
  do {                                                                               \
    const cublasStatus_t corolla_status_ = (call);                                   \
    if (corolla_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::corolla::cuda::throw_cublas_error(corolla_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Call right after `kernel<<<...>>>(...)`; `name` is the kernel's name.
#define COROLLA_CUDA_LAUNCH_CHECK(name) ::corolla::cuda::check_launch(name, __FILE__, __LINE__)
