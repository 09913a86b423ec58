// kernels/cpu/cpu_embedding.cpp — table lookups and their scatter-add backward.
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {
namespace {

/// Ids are validated before any parallel loop (nothing may throw inside one).
void check_ids(const std::int32_t* ids, std::int64_t n, std::int64_t vocab, const char* what) {
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw tensor_error(std::string(what) + ": id " + std::to_string(ids[i]) + " at position " +
                         std::to_string(i) + " is outside the table's [0, " +
                         std::to_string(vocab) + ")");
}

}  // namespace

void cpu_backend_impl::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  require_host(ids, dtype::i32, "embedding ids");
  require_that(ids.rank() == 1, "embedding ids", "expected a 1-D [N] tensor");
  require_host(table, dtype::f32, "embedding table");
  require_that(table.rank() == 2, "embedding table", "expected a 2-D [V, D] tensor");
  const std::int64_t n = ids.dim(0), vocab = table.dim(0), d = table.dim(1);
  require(out, dtype::f32, {n, d}, "embedding out");
  const std::int32_t* id = ids.data<std::int32_t>();
  check_ids(id, n, vocab, "embedding");
  const float* tp = table.data<float>();
  float* op = out.data<float>();
  parallel_for(n, d, [&](std::int64_t i) {
    std::memcpy(op + i * d, tp + static_cast<std::int64_t>(id[i]) * d,
                static_cast<std::size_t>(d) * sizeof(float));
  });
}

void cpu_backend_impl::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  require_host(ids, dtype::i32, "embedding_backward ids");
  require_that(ids.rank() == 1, "embedding_backward ids", "expected a 1-D [N] tensor");
  require_host(dtable, dtype::f32, "embedding_backward dtable");
  require_that(dtable.rank() == 2, "embedding_backward dtable", "expected a 2-D [V, D] tensor");
  const std::int64_t n = ids.dim(0), vocab = dtable.dim(0), d = dtable.dim(1);
  require(dout, dtype::f32, {n, d}, "embedding_backward dout");
  const std::int32_t* id = ids.data<std::int32_t>();
  check_ids(id, n, vocab, "embedding_backward");
  const float* gp = dout.data<float>();
  float* tp = dtable.data<float>();
  // Repeated ids add into the same row, so threads split the columns, not
  // the rows; every thread walks the ids in order (deterministic sums).
  parallel_ranges(d, n, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t i = 0; i < n; ++i) {
      float* row = tp + static_cast<std::int64_t>(id[i]) * d;
      const float* g = gp + i * d;
#pragma omp simd
      for (std::int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  });
}

}  // namespace corolla::cpu
