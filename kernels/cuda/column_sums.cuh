// kernels/cuda/column_sums.cuh — column sums over rows, parallel and
// deterministic, for the parameter gradients (linear's bias, the norms'
// weight and bias): the block-level sum, where a block's totals go, and the
// kernel that adds the chunks' partial sums (column_sums.hpp says how rows
// are split). No CUDA headers: compiles as host C++ against
// tests/cuda_emulated/cuda_emulation.hpp too.
#pragma once

#include <cstdint>

#include "kernels/cuda/column_sums.hpp"
#include "kernels/cuda/device_elem.cuh"

#if defined(__CUDACC__)
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/stream.hpp"
#endif

namespace corolla::cuda {
namespace {  // as the other kernel headers: each .cu its own copy of the kernels

/// A column-sum block is 32 x 32 threads (dim3(column_tile, column_tile))
/// over 32 columns (blockIdx.x) and one chunk of rows (blockIdx.y).
constexpr int column_tile = 32;

inline unsigned column_tiles(std::int64_t cols) {
  return static_cast<unsigned>((cols + column_tile - 1) / column_tile);
}

/// Where N column sums of `cols` columns go: acc[n][c] += the sum (A is
/// f32, bf16 or f16: one rounding on store). With more than one chunk
/// (gridDim.y > 1) the blocks write partials[(chunk * N + n) * cols + c]
/// instead (column_partials_bytes of them) and column_partials_kernel adds
/// them to acc.
template <int N, class A>
struct column_out {
  A* acc[N];
  float* partials;
};

/// Thread (x, y) of the block adds value(r, c, s) for rows r = r0 + y,
/// r0 + y + 32, ... < min(rows, r0 + chunk_rows), r0 = blockIdx.y *
/// chunk_rows, of column c = blockIdx.x * 32 + x into its N partial sums s;
/// thread (x, 0) adds the 32 partials in order into `total`. Returns true in
/// the threads that hold a column's totals. Contains __syncthreads: call
/// from all threads.
template <int N, class F>
__device__ __forceinline__ bool column_sums(std::int64_t rows, std::int64_t cols, std::int64_t chunk_rows, F&& value,
                                            float (&total)[N]) {
  __shared__ float part[N][column_tile][column_tile + 1];
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  const std::int64_t c = std::int64_t{blockIdx.x} * column_tile + x;
  const std::int64_t r0 = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t r1 = rows < r0 + chunk_rows ? rows : r0 + chunk_rows;
  float s[N];
#pragma unroll
  for (int n = 0; n < N; ++n) s[n] = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (std::int64_t r = r0 + y; r < r1; r += column_tile) value(r, c, s);
  }
#pragma unroll
  for (int n = 0; n < N; ++n) part[n][y][x] = s[n];
  __syncthreads();
  if (y != 0 || c >= cols) return false;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    total[n] = 0.0f;
    for (int k = 0; k < column_tile; ++k) total[n] += part[n][k][x];
  }
  return true;
}

/// Called by a thread column_sums returned true in: its column's totals to
/// the accumulators (one chunk) or to the partials.
template <int N, class A>
__device__ __forceinline__ void column_sums_store(const column_out<N, A>& out, std::int64_t cols,
                                                  const float (&total)[N]) {
  const std::int64_t c = std::int64_t{blockIdx.x} * column_tile + threadIdx.x;
  if (gridDim.y == 1) {
#pragma unroll
    for (int n = 0; n < N; ++n) store_f32(out.acc[n], c, load_f32(out.acc[n], c) + total[n]);
    return;
  }
#pragma unroll
  for (int n = 0; n < N; ++n) out.partials[(std::int64_t{blockIdx.y} * N + n) * cols + c] = total[n];
}

/// acc[n][c] += the `chunks` partial sums of column c, in chunk order. One
/// thread per column (grid-stride).
template <int N, class A>
__global__ void column_partials_kernel(column_out<N, A> out, unsigned chunks, std::int64_t cols) {
  for (std::int64_t c = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += std::int64_t{gridDim.x} * blockDim.x) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float t = 0.0f;
      for (unsigned k = 0; k < chunks; ++k) t += out.partials[(std::int64_t{k} * N + n) * cols + c];
      store_f32(out.acc[n], c, load_f32(out.acc[n], c) + t);
    }
  }
}

/// Threads per block of column_partials_kernel, and its blocks for `cols`.
constexpr int column_partials_threads = 256;
inline unsigned column_partials_blocks(std::int64_t cols) {
  return static_cast<unsigned>((cols + column_partials_threads - 1) / column_partials_threads);
}

#if defined(__CUDACC__)
/// Launches kernel(args..., chunk_rows, out) over column_tiles(cols) x
/// column_chunks blocks of 32 x 32 threads (one chunk of all rows without
/// column_chunking()), then, with more than one chunk,
/// column_partials_kernel (out.partials: column_partials_bytes(rows, cols,
/// N) of scratch, unused by anything else until it has run).
template <int N, class A, class... Params, class... Args>
void launch_column_sums(stream_t s, const char* name, void (*kernel)(Params...), std::int64_t rows,
                        std::int64_t cols, column_out<N, A> out, Args... args) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t chunk_rows = column_chunk_rows_for(rows, column_chunking());
  const unsigned chunks = column_chunks(rows, chunk_rows);
  if (chunks > 1 && out.partials == nullptr)
    throw std::logic_error(std::string(name) + ": column sums over several chunks need their partials' scratch");
  kernel<<<dim3(column_tiles(cols), chunks), dim3(column_tile, column_tile), 0, s>>>(args..., chunk_rows, out);
  COROLLA_CUDA_LAUNCH_CHECK(name);
  if (chunks > 1) {
    column_partials_kernel<N, A><<<column_partials_blocks(cols), column_partials_threads, 0, s>>>(out, chunks, cols);
    COROLLA_CUDA_LAUNCH_CHECK("column_partials_kernel");
  }
}
#endif

}  // namespace
}  // namespace corolla::cuda
