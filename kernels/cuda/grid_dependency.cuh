// kernels/cuda/grid_dependency.cuh — programmatic dependent launch (PDL,
// sm_90 and later) on the device side, and an L2 prefetch hint.
//
// A kernel launched as a dependent (launch_dependent, launch_dependent.cuh)
// may be scheduled while the kernel before it in the stream still runs:
// once every block of that kernel has called allow_dependents() or exited.
// It must call await_producers() before it reads anything an earlier
// kernel wrote or writes anything an earlier kernel reads: that wait
// returns when the previous grid has completed and its writes are visible.
// Before the wait it may only touch memory no kernel in flight writes, and
// the only such touch here is prefetch_l2 (a hint: L2 is the GPU's point
// of coherence, so a prefetched line is never stale for loads after the
// wait, whoever wrote it).
//
// On an ordinary launch, before sm_90, and under the CPU emulation of
// tests/cuda_emulated (which checks that producer-written memory is read
// only after the wait) these are no-ops.
// Included by .cu files and by the emulated kernel tests (C++17).
#pragma once

namespace corolla::cuda {

#ifndef COROLLA_CUDA_EMULATION

/// Lets the next kernel of the stream be scheduled now if it was launched as
/// a dependent; it still waits for this whole grid before reading its output.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Blocks the thread until the kernels this grid depends on have completed
/// and their writes are visible (immediate on an ordinary launch).
__device__ __forceinline__ void await_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Asks L2 to fetch the 128-byte line holding `p` (no data returned, no
/// wait; safe before await_producers, see the file comment).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

#endif  // COROLLA_CUDA_EMULATION (cuda_emulation.hpp defines the three)

}  // namespace corolla::cuda
