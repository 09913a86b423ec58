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
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      // Each thread streams one contiguous range with 4 x 16 independent
      // accumulators: wide loads and no dependency chain, so the loop is
      // bound by memory, not by add latency.
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::size_t blocks = n / 64;
      std::size_t b0 = blocks * static_cast<std::size_t>(t) / static_cast<std::size_t>(nt);
      std::size_t b1 = blocks * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(nt);
      float acc[4][16] = {};
      for (std::size_t b = b0; b < b1; ++b) {
        const float* q = p + b * 64;
        for (int k = 0; k < 4; ++k) {
#pragma omp simd
          for (int j = 0; j < 16; ++j) acc[k][j] += q[16 * k + j];
        }
      }
      for (auto& row : acc)
        for (float v : row) total += v;
    }
    auto t1 = std::chrono::steady_clock::now();
    sink = sink + total;
    double secs = std::chrono::duration<double>(t1 - t0).count();
    best = std::max(best, static_cast<double>(n / 64 * 64 * sizeof(float)) / secs / 1e9);
  }
  return {best, n * sizeof(float), threads};
}

}  // namespace corolla::app
