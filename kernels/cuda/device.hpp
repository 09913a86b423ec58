// kernels/cuda/device.hpp — host-only view of the CUDA runtime (no CUDA types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/env_switch.hpp"  // env_switch: the COROLLA_CUDA_* switches

namespace corolla::cuda {

/// Number of visible CUDA devices; 0 when the driver or a GPU is missing.
int device_count();
/// Why device_count() returned 0 ("no CUDA-capable device", driver missing...),
/// or "" when devices are visible.
std::string device_count_error();
/// "NVIDIA H200, 139 GiB, sm_90" for device `index`.
std::string device_description(int index);
/// Free and total bytes of device `index` now (cudaMemGetInfo on it): what
/// other processes and this one's allocator cache hold is not free.
/// Throws cuda_error.
std::pair<std::size_t, std::size_t> device_memory(int index);

/// Whether COROLLA_CUDA_SYNC (set, not 0) makes every launch synchronise
/// (check_launch, check.hpp).
bool sync_after_launch();

/// The largest power of two, up to 256, dividing the address: the
/// alignment a kernel's vector loads or cuBLASLt's algorithms may assume.
inline std::uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && (v & (2 * a - 1)) == 0) a *= 2;
  return a;
}

/// Programmatic dependent launch ("early launch", kernels/cuda/
/// grid_dependency.cuh): kernels that support it (the bf16-weight GEMV) are
/// scheduled while the kernel before them finishes. On by default where the
/// device has it (sm_90 and later); COROLLA_CUDA_EARLY_LAUNCH=0 (or off,
/// false, no) in the environment turns it off. Process-wide; takes effect
/// at the next launch. A kernel is launched early only if it was compiled
/// for compute_90 or later (launch_dependent.cuh): one compiled for an
/// older architecture has no wait in it.
void set_early_launch(bool on);
/// Whether early launch is requested (set_early_launch or the environment).
bool early_launch_requested();
/// Whether device `index` can launch early (compute capability 9.0 or later).
bool early_launch_supported(int index);
/// Whether launches on the calling thread's current device are early: the
/// request, and early_launch_supported.
bool early_launch_active();

/// Step graphs (cuda_backend::run_step, kernels/cuda/step_graph.cpp): a
/// decode step captured into a CUDA graph and launched as one, the graph's
/// executable updated in place from step to step, so the GPU runs the
/// step's few hundred kernels back to back instead of waiting on each
/// launch. Off by default until measured on a GPU; COROLLA_CUDA_GRAPHS=1
/// (or on, true, yes) in the environment turns them on. Process-wide; takes
/// effect at the next step.
void set_step_graphs(bool on);
/// Whether step graphs are requested (set_step_graphs or the environment).
bool step_graphs_requested();
/// What the step graphs of this process did, since it started.
struct step_graph_counts {
  std::uint64_t launched = 0;      ///< steps submitted as one graph
  std::uint64_t updated = 0;       ///< of those, an executable updated in place
  std::uint64_t instantiated = 0;  ///< executables made (the first, or another topology)
  std::uint64_t failed = 0;        ///< captures that failed (the step then ran without one)
  std::uint64_t eager = 0;         ///< steps of a recording run without a graph (its first, or turned off)
  std::string last_failure;        ///< why the last failed capture failed ("" if none)
};
step_graph_counts step_graph_totals();

}  // namespace corolla::cuda
