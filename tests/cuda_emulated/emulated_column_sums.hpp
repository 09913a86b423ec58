// tests/cuda_emulated/emulated_column_sums.hpp — a column-sum kernel
// (kernels/cuda/column_sums.cuh) run as cuda::launch_column_sums runs it on
// the GPU: column_tiles x chunks blocks of 32 x 32 threads, then, with more
// than one chunk, column_partials_kernel over partials that start as NaN (a
// partial never written shows up in the sums). The tests choose the rows per
// chunk: few, since every block is 1024 emulated threads here. Include after
// the kernel headers.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace emulated_test {

template <int N, class A, class... Params, class... Args>
void launch_column_sums(void (*kernel)(Params...), std::int64_t rows, std::int64_t cols, std::int64_t chunk_rows,
                        A* const (&acc)[N], const Args&... args) {
  namespace cuda = corolla::cuda;
  const unsigned chunks = cuda::column_chunks(rows, chunk_rows);
  std::vector<float> partials(chunks > 1 ? static_cast<std::size_t>(chunks) * N * static_cast<std::size_t>(cols) : 0,
                              std::numeric_limits<float>::quiet_NaN());
  cuda::column_out<N, A> out{};
  for (int n = 0; n < N; ++n) out.acc[n] = acc[n];
  out.partials = chunks > 1 ? partials.data() : nullptr;
  corolla::emulated::launch(kernel, {cuda::column_tiles(cols), chunks, cuda::column_tile, 0, cuda::column_tile},
                            args..., chunk_rows, out);
  if (chunks > 1)
    corolla::emulated::launch(&cuda::column_partials_kernel<N, A>,
                              {cuda::column_partials_blocks(cols), 1, cuda::column_partials_threads, 0}, out, chunks,
                              cols);
}

}  // namespace emulated_test
