// kernels/cuda/bandwidth.hpp — device memory read bandwidth, the bound that
// batch-1 decode on a GPU is compared against (every weight is read once per
// token). Host-only: no CUDA types.
#pragma once

#include <cstddef>

namespace corolla::cuda {

/// Result of a device read-bandwidth measurement.
struct device_bandwidth {
  double read_gbps = 0;   ///< best sweep, GB/s (1e9 bytes per second)
  std::size_t bytes = 0;  ///< bytes read per sweep
  int sweeps = 0;         ///< sweeps timed
};

/// Reads a `bytes`-sized buffer on device `index` (allocated with cudaMalloc
/// for the call, filled once, freed before returning) with a read-only
/// reduction kernel, `repeats` times, each sweep timed with CUDA events on
/// its own stream; returns the best. Use >= 1 GiB so the L2 cache (50 MiB on
/// an H100) does not serve the reads. Throws std::runtime_error naming the
/// failing CUDA call (no device, out of memory).
device_bandwidth measure_read_bandwidth(int index, std::size_t bytes = std::size_t{2} << 30,
                                        int repeats = 10);

}  // namespace corolla::cuda
