#include "kernels/vendor_gemm.hpp"

#include <cblas.h>

#include <chrono>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/cublas_reference.hpp"
#endif

namespace corolla {
namespace {

double time_cblas_sgemm(std::int64_t m, std::int64_t n, std::int64_t k, int calls, int rounds) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(n * k)),
      y(static_cast<std::size_t>(m * n));
  for (auto& v : x) v = u(rng);
  for (auto& v : w) v = u(rng);
  // The CPU backend keeps OpenBLAS at one thread and splits products over
  // its OpenMP threads (kernels/cpu/cpu_gemm.cpp); the raw call gets
  // OpenBLAS's own threading with the same count, restored afterwards.
  (void)cpu_backend();  // its constructor sets OpenBLAS to one thread: do that first
  openblas_set_num_threads(cpu_threads());
  struct restore_one_thread {
    ~restore_one_thread() { openblas_set_num_threads(1); }
  } restore;
  auto product = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, x.data(),
                static_cast<blasint>(k), w.data(), static_cast<blasint>(k), 0.0f, y.data(),
                static_cast<blasint>(n));
  };
  product();  // warm-up: threads started, pages touched
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) product();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    if (r == 0 || s < best) best = s;
  }
  return best;
}

}  // namespace

vendor_gemm_timing time_vendor_linear(device dev, dtype t, std::int64_t m, std::int64_t n,
                                      std::int64_t k, int calls, int rounds) {
  if (m <= 0 || n <= 0 || k <= 0 || calls <= 0 || rounds <= 0)
    throw std::invalid_argument("vendor gemm: m, n, k, calls and rounds must be positive");
  if (dev.kind == device_kind::cpu) {
    if (t != dtype::f32)
      throw std::invalid_argument(std::string("the CPU backend computes in f32; no ") +
                                  dtype_name(t) + " GEMM to compare on cpu (use --dtype f32)");
    return {time_cblas_sgemm(m, n, k, calls, rounds), "OpenBLAS cblas_sgemm"};
  }
#ifdef COROLLA_HAVE_CUDA
  return {cuda::cublaslt_linear_seconds(dev.index, t, m, n, k, calls, rounds), "cuBLASLt"};
#else
  throw cuda_not_built(dev);
#endif
}

}  // namespace corolla
