// kernels/cuda/page_tables.hpp — how a decode batch's kernels find each
// row's paged KV cache (host-only; the arrays are device memory).
#pragma once

#include <cstdint>

namespace corolla::cuda {

/// Row r of a decode batch is position row_keys[r] - 1 of its sequence
/// (row_keys[r] keys in its cache, counting its own): its key page p's
/// pointer is row_tables[r][k_offset + p * page_stride], its value page's
/// row_tables[r][v_offset + p * page_stride]. row_tables, the arrays it
/// points to and row_keys are device memory: either one upload of every
/// row's page pointers (page_stride 1), or the sequences' own device tables
/// (kv_sequence: every layer's keys and values interleaved a page).
struct batch_page_tables {
  const void* const* const* row_tables = nullptr;
  const std::int64_t* row_keys = nullptr;
  std::int64_t k_offset = 0, v_offset = 0, page_stride = 1;
};

}  // namespace corolla::cuda
