// kernels/cuda/cuda_attention_ops.cpp — the CUDA backend's attention ops:
// training attention forward and backward, one sequence's cached attention
// and a decode batch's (the paged caches' tables found on the device or
// uploaded), with the same argument checks as the CPU backend
// (kernels/op_checks.hpp); the kernels are attention*.cu's.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/op_args.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {
namespace {

attention_dims dims_of(const attention_geometry& g, const char* what) {
  if (g.dh > max_head_dim)
    throw tensor_error(std::string(what) + ": head_dim " + std::to_string(g.dh) +
                       " is not implemented on CUDA (the kernels take up to " +
                       std::to_string(max_head_dim) + ")");
  attention_dims d;
  d.hq = g.hq;
  d.hkv = g.hkv;
  d.dh = g.dh;
  d.group = g.group;
  d.q_width = g.q_width;
  d.kv_width = g.kv_width;
  d.scale = g.scale;
  return d;
}

}  // namespace

// ---- attention -------------------------------------------------------------------

void cuda_backend::attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch,
                             int seq, const attention_shape& s, Tensor& out, Tensor* lse) {
  const attention_geometry g = check_attention_geometry(s, "attention");
  require_condition(batch >= 0 && seq >= 0, "attention", "batch and seq must not be negative");
  const std::int64_t B = batch, T = seq, rows = B * T;
  // q, k, v, out: one float dtype (f32, bf16 or f16); lse f32.
  const elem t = float_elem(q, dev(), "attention q");
  require_on(q, dev(), q.type(), {rows, g.q_width}, "attention q");
  require_on(k, dev(), q.type(), {rows, g.kv_width}, "attention k");
  require_on(v, dev(), q.type(), {rows, g.kv_width}, "attention v");
  require_on(out, dev(), q.type(), {rows, g.q_width}, "attention out");
  if (lse) require_on(*lse, dev(), dtype::f32, {B * g.hq * T}, "attention lse");
  const attention_dims d = dims_of(g, "attention");
  if (rows == 0) return;
  device_guard guard(index_);
  attention_forward(stream_, d, t, q.raw(), k.raw(), v.raw(), B, T, out.raw(), lse ? f(*lse) : nullptr,
                    get_matmul_precision() == matmul_precision::bf16);
}

void cuda_backend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& out, const Tensor& lse, const Tensor& dout,
                                      int batch, int seq, const attention_shape& s, Tensor& dq,
                                      Tensor& dk, Tensor& dv) {
  const attention_geometry g = check_attention_geometry(s, "attention_backward");
  require_condition(batch >= 0 && seq >= 0, "attention_backward",
                    "batch and seq must not be negative");
  const std::int64_t B = batch, T = seq, rows = B * T;
  const elem t = float_elem(q, dev(), "attention_backward q");
  require_on(q, dev(), q.type(), {rows, g.q_width}, "attention_backward q");
  require_on(k, dev(), q.type(), {rows, g.kv_width}, "attention_backward k");
  require_on(v, dev(), q.type(), {rows, g.kv_width}, "attention_backward v");
  require_on(out, dev(), q.type(), {rows, g.q_width}, "attention_backward out");
  require_on(lse, dev(), dtype::f32, {B * g.hq * T}, "attention_backward lse");
  require_on(dout, dev(), q.type(), {rows, g.q_width}, "attention_backward dout");
  require_on(dq, dev(), q.type(), {rows, g.q_width}, "attention_backward dq");
  require_on(dk, dev(), q.type(), {rows, g.kv_width}, "attention_backward dk");
  require_on(dv, dev(), q.type(), {rows, g.kv_width}, "attention_backward dv");
  const attention_dims d = dims_of(g, "attention_backward");
  if (rows == 0) return;
  device_guard guard(index_);
  auto* delta = static_cast<float*>(
      scratch(slot_reduce, static_cast<std::size_t>(B * g.hq * T) * sizeof(float)));
  cuda::attention_backward(stream_, d, t, q.raw(), k.raw(), v.raw(), out.raw(), cf(lse), dout.raw(), B, T,
                           dq.raw(), dk.raw(), dv.raw(), delta, get_matmul_precision() == matmul_precision::bf16);
}

void cuda_backend::attention_cached(const Tensor& q, const kv_pages_view& cache,
                                    std::int64_t start_pos, const attention_shape& s,
                                    Tensor& out) {
  const attention_geometry g = check_attention_geometry(s, "attention_cached");
  require_on(q, dev(), dtype::f32, "attention_cached q");
  require_condition(q.rank() == 2, "attention_cached q",
                    "expected a 2-D [Tq, Hq * head_dim] tensor");
  const std::int64_t tq = q.dim(0);
  require_on(q, dev(), dtype::f32, {tq, g.q_width}, "attention_cached q");
  require_on(out, dev(), dtype::f32, {tq, g.q_width}, "attention_cached out");
  const std::int64_t pages = check_kv_pages(cache, start_pos, tq, "attention_cached");
  const attention_dims d = dims_of(g, "attention_cached");
  if (tq == 0) return;
  device_guard guard(index_);
  const void* const* k_table = nullptr;
  const void* const* v_table = nullptr;
  std::int64_t stride = 1;
  if (cache.device_pages != nullptr) {
    // The sequence keeps its tables on this device (kv_sequence): nothing
    // to upload, no copy between the kernels of a decode step.
    require_pages_device(cache, "attention_cached");
    k_table = cache.device_pages + cache.key_entry;
    v_table = k_table + 1;
    stride = cache.page_stride;
  } else {
    require_device_page(cache.k_pages[0], "attention_cached");
    // Upload the page-pointer table: keys then values.
    host_pages_.resize(static_cast<std::size_t>(2 * pages));
    for (std::int64_t p = 0; p < pages; ++p) {
      host_pages_[static_cast<std::size_t>(p)] = cache.k_pages[static_cast<std::size_t>(p)];
      host_pages_[static_cast<std::size_t>(pages + p)] = cache.v_pages[static_cast<std::size_t>(p)];
    }
    const std::size_t bytes = host_pages_.size() * sizeof(const void*);
    auto* table = static_cast<const void**>(scratch(slot_pages, bytes));
    upload(table, host_pages_.data(), bytes);
    k_table = table;
    v_table = table + pages;
  }
  const std::size_t part_bytes = cuda::attention_cached_scratch_bytes(d, tq, start_pos);
  auto* part = part_bytes ? static_cast<float*>(scratch(slot_reduce, part_bytes)) : nullptr;
  cuda::attention_cached(stream_, d, cf(q), tq, elem_of(cache.type, "attention_cached pages"), k_table, v_table, stride,
                         cache.page_tokens, start_pos, f(out), part);
}

bool cuda_backend::device_page_rows(std::span<const kv_pages_view> caches, std::span<const std::int64_t> start_pos,
                                    const char* what, cuda::batch_page_tables& t) {
  for (const kv_pages_view& c : caches)
    if (c.device_pages == nullptr || c.page_stride != caches[0].page_stride || c.key_entry != caches[0].key_entry)
      return false;
  for (const kv_pages_view& c : caches) require_pages_device(c, what);
  const std::size_t n = caches.size();
  const std::size_t bytes = n * (sizeof(const void*) + sizeof(std::int64_t));
  host_batch_.resize(bytes);
  auto* tables = reinterpret_cast<const void* const**>(host_batch_.data());
  auto* keys = reinterpret_cast<std::int64_t*>(host_batch_.data() + n * sizeof(const void*));
  for (std::size_t i = 0; i < n; ++i) {
    tables[i] = caches[i].device_pages;
    keys[i] = start_pos[i] + 1;
  }
  auto* at = static_cast<std::byte*>(scratch(slot_batch_rows, bytes));
  upload_once(slot_batch_rows, at, host_batch_.data(), bytes);
  t.row_tables = reinterpret_cast<const void* const* const*>(at);
  t.row_keys = reinterpret_cast<const std::int64_t*>(at + n * sizeof(const void*));
  t.k_offset = caches[0].key_entry;
  t.v_offset = caches[0].key_entry + 1;
  t.page_stride = caches[0].page_stride;
  return true;
}

void cuda_backend::require_pages_device(const kv_pages_view& cache, const char* what) {
  if (cache.pages_device != dev())
    throw tensor_error(std::string(what) + ": the cache's page tables are memory of " + cache.pages_device.str() +
                       ", not of " + name());
}

void cuda_backend::require_device_page(const void* page, const char* what) {
  // The pages must be memory of this device: a host cache belongs to the
  // cpu backend. One attribute query (of the first key page) per call.
  cudaPointerAttributes attr{};
  COROLLA_CUDA_CHECK(cudaPointerGetAttributes(&attr, page));
  if (attr.type != cudaMemoryTypeDevice || attr.device != index_)
    throw tensor_error(std::string(what) + ": the cache pages are not memory of " + name() +
                       " (a host-resident cache goes with the cpu backend)");
}

void cuda_backend::attention_cached_batch(const Tensor& q, std::span<const kv_pages_view> caches,
                                          std::span<const std::int64_t> start_pos, const attention_shape& s,
                                          Tensor& out) {
  const char* what = "attention_cached_batch";
  const attention_geometry g = check_attention_geometry(s, what);
  const auto n = static_cast<std::int64_t>(caches.size());
  require_condition(start_pos.size() == caches.size(), what, "one start position per cache");
  require_on(q, dev(), dtype::f32, {n, g.q_width}, "attention_cached_batch q");
  require_on(out, dev(), dtype::f32, {n, g.q_width}, "attention_cached_batch out");
  if (n == 0) return;
  std::int64_t total = 0, splits = 1;
  for (std::int64_t i = 0; i < n; ++i) {
    const kv_pages_view& c = caches[static_cast<std::size_t>(i)];
    const std::int64_t pos = start_pos[static_cast<std::size_t>(i)];
    total += check_kv_pages(c, pos, 1, what);
    require_condition(c.type == caches[0].type && c.page_tokens == caches[0].page_tokens, what,
                      "every cache of a batch has the same element type and page size");
    splits = std::max(splits, cuda::attention_cached_key_chunks(1, pos));
  }
  const attention_dims d = dims_of(g, what);
  device_guard guard(index_);
  cuda::batch_page_tables t;
  if (!device_page_rows(caches, start_pos, what, t)) {
    require_device_page(caches[0].k_pages[0], what);
    // One upload: every sequence's key page pointers, then their value
    // page pointers, then per row where its pointers start, then the rows'
    // key counts.
    const std::size_t table_bytes = static_cast<std::size_t>(2 * total) * sizeof(const void*);
    const std::size_t bytes = table_bytes + static_cast<std::size_t>(n) * (sizeof(const void*) + sizeof(std::int64_t));
    host_batch_.resize(bytes);
    auto* at = static_cast<std::byte*>(scratch(slot_pages, bytes));
    auto* pages = reinterpret_cast<const void**>(host_batch_.data());
    auto* tables = reinterpret_cast<const void* const**>(host_batch_.data() + table_bytes);
    auto* keys = reinterpret_cast<std::int64_t*>(host_batch_.data() + table_bytes + n * sizeof(const void*));
    const auto* device_pages = reinterpret_cast<const void* const*>(at);
    std::int64_t used_so_far = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const kv_pages_view& c = caches[static_cast<std::size_t>(i)];
      keys[i] = start_pos[static_cast<std::size_t>(i)] + 1;
      const std::int64_t used = (keys[i] + c.page_tokens - 1) / c.page_tokens;
      for (std::int64_t p = 0; p < used; ++p) {
        pages[used_so_far + p] = c.k_pages[static_cast<std::size_t>(p)];
        pages[total + used_so_far + p] = c.v_pages[static_cast<std::size_t>(p)];
      }
      tables[i] = device_pages + used_so_far;
      used_so_far += used;
    }
    upload(at, host_batch_.data(), bytes);
    t.row_tables = reinterpret_cast<const void* const* const*>(at + table_bytes);
    t.row_keys = reinterpret_cast<const std::int64_t*>(at + table_bytes + n * sizeof(const void*));
    t.v_offset = total;
  }
  const std::size_t part_bytes =
      splits > 1 ? static_cast<std::size_t>(n * g.hq * splits * (g.dh + 2)) * sizeof(float) : 0;
  auto* part = part_bytes ? static_cast<float*>(scratch(slot_reduce, part_bytes)) : nullptr;
  cuda::attention_cached_batch(stream_, d, cf(q), n, elem_of(caches[0].type, "attention_cached_batch pages"), t,
                               caches[0].page_tokens, splits, f(out), part);
}

}  // namespace corolla::cuda
