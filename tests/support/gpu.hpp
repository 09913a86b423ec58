// tests/support/gpu.hpp — whether this test process can run GPU tests, and
// the skip that says why not.
#pragma once

#include <string>

#include "kernels/backend.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#endif

namespace corolla::testing {

/// Why the GPU tests cannot run in this process, or "" when they can.
inline std::string gpu_skip_reason() {
#ifndef COROLLA_HAVE_CUDA
  return "this binary was built without the CUDA backend (COROLLA_CUDA=OFF or no nvcc)";
#else
  if (cuda_device_count() == 0) return "no CUDA device visible: " + cuda::device_count_error();
  return "";
#endif
}

}  // namespace corolla::testing

/// Returns from the test case with a MESSAGE saying why when no GPU can run it.
#define REQUIRE_GPU_OR_SKIP()                                    \
  do {                                                           \
    const std::string why_ = ::corolla::testing::gpu_skip_reason(); \
    if (!why_.empty()) {                                         \
      MESSAGE("skipped: " << why_);                              \
      return;                                                    \
    }                                                            \
  } while (0)
