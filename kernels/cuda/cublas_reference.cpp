// kernels/cuda/cublas_reference.cpp — raw cuBLASLt timing (cublas_reference.hpp).
//
// Layout: row-major y[m,n] = x[m,k] @ w[n,k]^T is column-major
// y^T[n,m] = (w as column-major k x n)^T @ (x as column-major k x m), the
// "TN" case: cuBLAS A = w with op T (lda = k), B = x with op N (ldb = k),
// C = y (ldc = n). This is what cuda_backend::linear hands to cuBLASLt.
#include "kernels/cuda/cublas_reference.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/half.hpp"

namespace corolla::cuda {
namespace {

cudaDataType_t lt_type(dtype t) {
  switch (t) {
    case dtype::f32: return CUDA_R_32F;
    case dtype::bf16: return CUDA_R_16BF;
    case dtype::f16: return CUDA_R_16F;
    default:
      throw std::invalid_argument(std::string("cuBLASLt reference: no cuBLAS type for ") +
                                  dtype_name(t) + " (expected f32, bf16 or f16)");
  }
}

/// Everything one measurement creates, released also when a check throws.
struct lt_resources {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
  ~lt_resources() {
    if (stream) cudaStreamSynchronize(stream);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    for (void* p : {x, w, y, workspace})
      if (p) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
    if (handle) cublasLtDestroy(handle);
  }
};

/// `count` pseudo-random values in [-1, 1) of dtype `t`, uploaded to `dst`.
void fill_uniform(void* dst, dtype t, std::int64_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto n = static_cast<std::size_t>(count);
  if (t == dtype::f32) {
    std::vector<float> host(n);
    for (auto& v : host) v = u(rng);
    COROLLA_CUDA_CHECK(cudaMemcpy(dst, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return;
  }
  std::vector<std::uint16_t> host(n);
  for (auto& v : host) v = t == dtype::bf16 ? f32_to_bf16(u(rng)) : f32_to_f16(u(rng));
  COROLLA_CUDA_CHECK(
      cudaMemcpy(dst, host.data(), n * sizeof(std::uint16_t), cudaMemcpyHostToDevice));
}

}  // namespace

double cublaslt_linear_seconds(int index, dtype t, std::int64_t m, std::int64_t n, std::int64_t k,
                               int calls, int rounds) {
  if (m <= 0 || n <= 0 || k <= 0 || calls <= 0 || rounds <= 0)
    throw std::invalid_argument("cuBLASLt reference: m, n, k, calls and rounds must be positive");
  const cudaDataType_t type = lt_type(t);
  const std::size_t elem_bytes = dtype_size(t);
  device_guard guard(index);
  lt_resources r;
  COROLLA_CUBLAS_CHECK(cublasLtCreate(&r.handle));
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  const std::size_t workspace_bytes = std::size_t{32} << 20;
  COROLLA_CUDA_CHECK(cudaMalloc(&r.workspace, workspace_bytes));
  COROLLA_CUDA_CHECK(cudaMalloc(&r.x, static_cast<std::size_t>(m * k) * elem_bytes));
  COROLLA_CUDA_CHECK(cudaMalloc(&r.w, static_cast<std::size_t>(n * k) * elem_bytes));
  COROLLA_CUDA_CHECK(cudaMalloc(&r.y, static_cast<std::size_t>(m * n) * elem_bytes));
  fill_uniform(r.x, t, m * k, 1);
  fill_uniform(r.w, t, n * k, 2);

  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&r.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
  COROLLA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(r.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  COROLLA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(r.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // Stored buffers as column-major (rows = row length, cols = row count).
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&r.la, type, k, n, k));  // w
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&r.lb, type, k, m, k));  // x
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&r.lc, type, n, m, n));  // y

  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&r.pref));
  const std::uint64_t ws = workspace_bytes;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      r.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      r.handle, r.op, r.la, r.lb, r.lc, r.lc, r.pref, 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
    throw_cublas_error(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0)
    throw std::runtime_error("cuBLASLt reference: no algorithm for m=" + std::to_string(m) +
                             " n=" + std::to_string(n) + " k=" + std::to_string(k) + " " +
                             dtype_name(t));

  const float alpha = 1.0f, beta = 0.0f;
  auto product = [&] {
    COROLLA_CUBLAS_CHECK(cublasLtMatmul(r.handle, r.op, &alpha, r.w, r.la, r.x, r.lb, &beta, r.y,
                                        r.lc, r.y, r.lc, &result.algo, r.workspace,
                                        workspace_bytes, r.stream));
  };
  product();  // warm-up: kernel load, clocks up
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  double best = 0;
  for (int round = 0; round < rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) product();
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(r.stream));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    if (round == 0 || s < best) best = s;
  }
  return best;
}

}  // namespace corolla::cuda
