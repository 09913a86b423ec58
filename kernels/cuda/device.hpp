// kernels/cuda/device.hpp — host-only view of the CUDA runtime (no CUDA types).
#pragma once

#include <string>

namespace corolla::cuda {

/// Number of visible CUDA devices; 0 when the driver or a GPU is missing.
int device_count();
/// Why device_count() returned 0 ("no CUDA-capable device", driver missing...),
/// or "" when devices are visible.
std::string device_count_error();
/// "NVIDIA H200, 139 GiB, sm_90" for device `index`.
std::string device_description(int index);

}  // namespace corolla::cuda
