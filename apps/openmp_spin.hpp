// apps/openmp_spin.hpp — how long idle OpenMP threads spin.
//
// libgomp's threads spin for about 300,000 iterations (milliseconds) after
// every parallel region before they sleep. Beside OpenBLAS's own threads
// (GEMMs) and in every process of a chain of servers or pipeline ranks on
// one machine, that spinning takes the cores the threads with work need:
// `corolla bench swarm --servers 2 --server-threads 2` decodes 19.6
// steps/s with the default and 31.9 with a spin count of 100,000, and
// local decode runs 38.5 -> 43.6 steps/s (docs/benchmarks.md).
//
// libgomp reads the setting once, in its own initialiser, so the corolla
// binary sets it from its .preinit_array, which runs before any shared
// library's initialiser: GOMP_SPINCOUNT=100000 unless OMP_WAIT_POLICY or
// GOMP_SPINCOUNT is set already (the user's choice wins). Every process
// the binary starts inherits it.
#pragma once

namespace corolla::app {

/// The spin count corolla sets.
inline constexpr const char* openmp_spin_count = "100000";

}  // namespace corolla::app
