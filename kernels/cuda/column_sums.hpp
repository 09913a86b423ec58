// kernels/cuda/column_sums.hpp — how the column-sum kernels (bias and norm
// parameter gradients: column_sums.cuh) split their rows, and the scratch
// their partial sums need. Host-only, no CUDA headers.
//
// A block sums 32 columns over one chunk of `column_chunk_rows` rows; with
// more than one chunk each block writes its partial sums and a second
// kernel adds them, chunk by chunk in order, to the accumulators. The
// chunking depends only on the number of rows, so a result is the same bits
// on every run and every GPU. One block per 32 columns over all rows (the
// kernels before) ran 50 blocks for GPT-2-1.5B's 1600 columns on a
// 132-multiprocessor GPU, each thread walking 128 rows one load at a time;
// COROLLA_CUDA_COLUMN_CHUNKS=0 runs them so (all rows in one chunk), the
// A/B and the fallback should the chunked sums fail on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device.hpp"

namespace corolla::cuda {

/// Whether column sums split their rows into chunks (the default):
/// COROLLA_CUDA_COLUMN_CHUNKS=0 (or off, false, no) in the environment puts
/// every column tile's rows in one block. Read once per process.
inline bool column_chunking() {
  static const bool on = env_switch("COROLLA_CUDA_COLUMN_CHUNKS", true);
  return on;
}

/// Rows of one chunk (a block's share of a column tile).
constexpr std::int64_t column_chunk_rows = 256;
/// At most this many chunks (the grid's y dimension).
constexpr std::int64_t column_max_chunks = 65535;

/// Rows per chunk for `rows` rows: column_chunk_rows, or more where that
/// would make more than column_max_chunks chunks; unless `chunked`, all of
/// them (one chunk).
inline std::int64_t column_chunk_rows_for(std::int64_t rows, bool chunked = true) {
  if (!chunked) return rows > 1 ? rows : 1;
  const std::int64_t least = (rows + column_max_chunks - 1) / column_max_chunks;
  return least > column_chunk_rows ? least : column_chunk_rows;
}

/// Chunks of `chunk_rows` rows for `rows` rows (at least one).
inline unsigned column_chunks(std::int64_t rows, std::int64_t chunk_rows) {
  if (rows <= chunk_rows) return 1;
  return static_cast<unsigned>((rows + chunk_rows - 1) / chunk_rows);
}

/// Bytes of partial sums for `sums` sums of `cols` columns over `rows`
/// rows split as the launchers split them (`chunked`: column_chunking()): 0
/// for a single chunk (the block adds its totals itself).
inline std::size_t column_partials_bytes(std::int64_t rows, std::int64_t cols, int sums, bool chunked = true) {
  const unsigned chunks = column_chunks(rows, column_chunk_rows_for(rows, chunked));
  if (chunks <= 1 || cols <= 0) return 0;
  return static_cast<std::size_t>(chunks) * static_cast<std::size_t>(sums) * static_cast<std::size_t>(cols) *
         sizeof(float);
}

}  // namespace corolla::cuda
