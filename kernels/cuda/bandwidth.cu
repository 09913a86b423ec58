// kernels/cuda/bandwidth.cu — device memory read bandwidth (bandwidth.hpp).
#include "kernels/cuda/bandwidth.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.hpp"

namespace corolla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

/// Each thread reads 16-byte vectors, kUnroll independent loads per step
/// (enough bytes in flight to cover HBM latency), grid-stride over the whole
/// buffer; XOR-folds them so the loads cannot be elided and writes one word
/// per thread block.
__global__ void read_sweep(const uint4* __restrict__ p, std::size_t n, unsigned* __restrict__ out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  // Block reduction by XOR through shared memory.
  __shared__ unsigned part[kThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] ^= part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

/// Frees what the measurement allocated, also when a check throws.
struct sweep_resources {
  void* buffer = nullptr;
  unsigned* out = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~sweep_resources() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    if (out) cudaFree(out);
    if (buffer) cudaFree(buffer);
  }
};

}  // namespace

device_bandwidth measure_read_bandwidth(int index, std::size_t bytes, int repeats) {
  device_guard guard(index);
  const std::size_t n = std::max<std::size_t>(bytes / sizeof(uint4), 1);
  cudaDeviceProp prop{};
  COROLLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  // Enough resident blocks to fill every SM (8 blocks of 256 threads each).
  const int blocks = prop.multiProcessorCount * (prop.maxThreadsPerMultiProcessor / kThreads);

  sweep_resources r;
  COROLLA_CUDA_CHECK(cudaMalloc(&r.buffer, n * sizeof(uint4)));
  COROLLA_CUDA_CHECK(cudaMalloc(&r.out, static_cast<std::size_t>(blocks) * sizeof(unsigned)));
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  COROLLA_CUDA_CHECK(cudaEventCreate(&r.start));
  COROLLA_CUDA_CHECK(cudaEventCreate(&r.stop));
  // Non-zero bytes, written once (the first sweep would otherwise also pay
  // for first-touch page mapping).
  COROLLA_CUDA_CHECK(cudaMemsetAsync(r.buffer, 0x5a, n * sizeof(uint4), r.stream));
  read_sweep<<<blocks, kThreads, 0, r.stream>>>(static_cast<const uint4*>(r.buffer), n, r.out);
  COROLLA_CUDA_LAUNCH_CHECK("read_sweep (warm-up)");

  double best = 0;
  for (int s = 0; s < repeats; ++s) {
    COROLLA_CUDA_CHECK(cudaEventRecord(r.start, r.stream));
    read_sweep<<<blocks, kThreads, 0, r.stream>>>(static_cast<const uint4*>(r.buffer), n, r.out);
    COROLLA_CUDA_LAUNCH_CHECK("read_sweep");
    COROLLA_CUDA_CHECK(cudaEventRecord(r.stop, r.stream));
    COROLLA_CUDA_CHECK(cudaEventSynchronize(r.stop));
    float ms = 0;
    COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    if (ms > 0) best = std::max(best, static_cast<double>(n * sizeof(uint4)) / (ms * 1e-3) / 1e9);
  }
  return {best, n * sizeof(uint4), repeats};
}

}  // namespace corolla::cuda
