#include "apps/membw.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/backend.hpp"

namespace corolla::app {

bandwidth_result measure_read_bandwidth(std::size_t bytes, int repeats) {
  std::size_t n = bytes / sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))), &std::free);
  float* p = buf.get();
  int threads = cpu_threads();
  // First touch from the threads that will read (NUMA placement), non-zero data.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>(i & 7);

  double best = 0;
  volatile float sink = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (std::size_t i = 0; i < n; i += 16) {
      // 16 independent lanes per iteration: wide loads, no dependency chain.
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (std::size_t j = 0; j < 16; ++j) s += p[i + j];
      total += s;
    }
    auto t1 = std::chrono::steady_clock::now();
    sink = sink + total;
    double secs = std::chrono::duration<double>(t1 - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(float)) / secs / 1e9);
  }
  return {best, n * sizeof(float), threads};
}

}  // namespace corolla::app
