// kernels/cuda/async_copy.cuh — asynchronous 16-byte copies from global to
// shared memory (cp.async, sm_80 and later), which keep bytes in flight
// without holding registers for them.
//
// A thread issues copies, closes them into a group (async_commit), and
// async_wait<N>() returns once at most N of its groups are still in flight:
// the copies of every older group have landed in shared memory, visible to
// this thread (to others only after a barrier). The copies bypass L1 (.cg):
// for data read once, such as a GEMV's weights.
//
// Before sm_80 the copy is an ordinary load and store (commit and wait do
// nothing). Under the CPU emulation of tests/cuda_emulated, which defines
// the three first, a copy is performed only when a wait retires its group,
// so shared memory read before its wait shows the NaN it started as.
// Included by .cu files and by the emulated kernel tests (C++17).
#pragma once

#include <cstdint>

namespace corolla::cuda {

#ifndef COROLLA_CUDA_EMULATION

/// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned)
/// in the background.
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#else
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}

/// Closes this thread's copies issued since the last commit into a group.
__device__ __forceinline__ void async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#endif  // COROLLA_CUDA_EMULATION (cuda_emulation.hpp defines the three)

}  // namespace corolla::cuda
