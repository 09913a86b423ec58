// kernels/cuda/check.cpp — the error paths of check.hpp's macros.
#include "kernels/cuda/check.hpp"

#include <stdexcept>

#include "kernels/env_switch.hpp"

namespace corolla::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Clear the sticky "last error" so the next call does not report it again
  // (a sticky context error such as an illegal address stays regardless).
  cudaGetLastError();
  throw std::runtime_error(std::string("CUDA error: ") + call + " at " + file + ":" +
                           std::to_string(line) + ": " + cudaGetErrorName(status) + ": " +
                           cudaGetErrorString(status));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLAS error: ") + call + " at " + file + ":" +
                           std::to_string(line) + ": " + cublasLtGetStatusName(status) + ": " +
                           cublasLtGetStatusString(status));
}

bool sync_after_launch() {
  static const bool on = env_switch("COROLLA_CUDA_SYNC", false);
  return on;
}

void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess && sync_after_launch()) status = cudaDeviceSynchronize();
  if (status != cudaSuccess) throw_cuda_error(status, kernel, file, line);
}

device_guard::device_guard(int index) : index_(index) {
  COROLLA_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) COROLLA_CUDA_CHECK(cudaSetDevice(index));
}

device_guard::~device_guard() {
  if (previous_ != index_ && previous_ >= 0) cudaSetDevice(previous_);  // best effort
}

}  // namespace corolla::cuda
