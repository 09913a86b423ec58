// kernels/cuda/allocator.hpp — the caching device-memory allocator behind
// storage::allocate for CUDA tensors (host-only: no CUDA types).
//
// cudaMalloc underneath (never managed memory). Freed blocks go to a free
// list per device and size class and are reused by the next request of the
// same class, so a steady-state training or decode loop calls cudaMalloc
// only while it warms up. When cudaMalloc reports out-of-memory the
// device's cache is released and the request retried once; a second
// failure throws cuda_out_of_memory ("cuda:0 out of memory allocating
// X MiB (Y MiB in use, Z MiB cached)").
//
// Stream order: blocks are shared by the work of every stream on a device
// without events. That is safe because each device has one shared backend
// stream, and the memory hooks below use the legacy default stream, which
// that stream (created blocking) synchronises with. A companion backend
// instance (cuda_backend::companion) has a stream of its own and waits for
// the whole device before it allocates.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace corolla::cuda {

/// Thrown when device memory is exhausted even after the cache was released.
class cuda_out_of_memory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Usage of one device's allocator, in bytes.
struct allocator_stats {
  std::size_t in_use = 0;   ///< handed out and not yet released
  std::size_t cached = 0;   ///< released and kept for reuse
  std::size_t peak_in_use = 0;
  std::size_t device_mallocs = 0;  ///< cudaMalloc calls that succeeded
};

/// `bytes` (rounded up to the size class) of device memory on `index`.
/// Throws cuda_out_of_memory, or std::runtime_error for a missing device.
void* device_allocate(std::size_t bytes, int index);
/// Returns a block from device_allocate to the cache. Never throws.
void device_release(void* p, int index) noexcept;
/// Frees every cached block of device `index` (cudaFree; synchronises).
void release_cached(int index);
/// Current figures for device `index`.
allocator_stats stats(int index);
/// The size class `bytes` rounds up to: multiples of 512 bytes up to 1 MiB,
/// then multiples of 2 MiB.
std::size_t size_class(std::size_t bytes);

/// Marks a step being captured into a CUDA graph on device `index` (on:
/// one more; off: one fewer; kernels/cuda/step_graph.cpp). While one is,
/// an out-of-memory allocation throws at once instead of releasing the
/// cache and retrying: cudaFree would end the capture, and the blocks it
/// frees may be in the captured work. The step then runs again without a
/// graph, where the retry happens.
void set_capture_underway(int index, bool on);

/// Registers allocate/release/zero/copy for device_kind::cuda with the tensor
/// layer (kernels/tensor.hpp). Idempotent and thread-safe.
void install_memory_ops();

}  // namespace corolla::cuda
