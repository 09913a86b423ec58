// kernels/memory_available.hpp — how much memory a device has free now: what
// `corolla serve --max-memory auto` sizes a server's blocks and KV cache by.
#pragma once

#include <cstdint>

#include "kernels/backend.hpp"

namespace corolla {

struct memory_available {
  std::uint64_t free_bytes = 0;   ///< usable now without taking it from anyone
  std::uint64_t total_bytes = 0;  ///< the device's (or the host's) whole memory
};

/// A CUDA device's free and total memory (cudaMemGetInfo), or the host's
/// MemAvailable and MemTotal from /proc/meminfo for the cpu. Throws
/// std::runtime_error when it cannot be read (no such device, a binary
/// built without CUDA, no /proc/meminfo).
memory_available available_memory(device dev);

/// What a server started with `--max-memory auto` gives its blocks and KV
/// cache on `dev`: on a GPU the free memory less a reserve of 5 % of the
/// device or 1 GiB, whichever is more (cuBLASLt workspaces, prefill
/// activations, the allocator's rounding); on the cpu half of the memory
/// available, so that a volunteer's own machine stays usable. Zero when
/// nothing is left.
std::uint64_t auto_memory_budget(device dev, const memory_available& m);

}  // namespace corolla
