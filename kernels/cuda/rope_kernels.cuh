// kernels/cuda/rope_kernels.cuh — the RoPE and RoPE + KV-append kernels
// (rope.cu says how the angles are computed). Included by rope.cu, and by
// tests/cuda_emulated/, which runs them on the CPU against an emulation of
// the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/grid_dependency.cuh"
#include "kernels/rope_spec.hpp"

namespace corolla::cuda {
namespace {

/// cos and sin of position `pos` for pair i of a head (times the spec's scale).
__device__ __forceinline__ void rope_angle(std::int32_t pos, int i, int head_dim, const rope_spec& spec,
                                           float& c, float& sn) {
  const double angle = static_cast<double>(pos) * spec.inv_freq(i, head_dim);
  const double scale = spec.scale();
  c = static_cast<float>(scale * cos(angle));
  sn = static_cast<float>(scale * sin(angle));
}

/// The pair (a, b) rotated by (c, sn): every RoPE kernel's one expression,
/// each product and sum rounded on its own (no contraction left to the
/// compiler), so the fused GEMV epilogue (linear_bf16_rope_kv_kernel) and
/// rope_store_kv_kernel give the same bits.
__device__ __forceinline__ void rope_rotate(float a, float b, float c, float sn, float& x1, float& x2) {
  x1 = __fadd_rn(__fmul_rn(a, c), -__fmul_rn(b, sn));
  x2 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn));
}

/// Where pair i (elements i and i + head_dim/2) of head-row rh (row *
/// heads + head) goes, given its values (a, b): rotated by its row's
/// position when `rotate`; a q pair into q, a k pair into its row's cache
/// row k_at(row) (type KT: f32, or bf16/f16 rounded once on store).
template <class KT, class KAt>
__device__ __forceinline__ void rope_store_pair(bool is_q, std::int64_t rh, int i, float a, float b, float* q,
                                                const std::int32_t* positions, int hq, int hkv, int head_dim,
                                                const rope_spec& spec, bool rotate, KAt k_at) {
  const int half = head_dim / 2;
  float x1 = a, x2 = b;
  if (rotate) {
    float c, sn;
    rope_angle(positions[rh / (is_q ? hq : hkv)], i, head_dim, spec, c, sn);
    rope_rotate(a, b, c, sn, x1, x2);
  }
  if (is_q) {
    q[rh * head_dim + i] = x1;
    q[rh * head_dim + i + half] = x2;
  } else {
    KT* row = k_at(rh / hkv);
    const std::int64_t at = (rh % hkv) * head_dim + i;
    store_f32(row, at, x1);
    store_f32(row, at + half, x2);
  }
}

/// One thread per (row, head, i < head_dim/2); x stored as T, rotated in f32.
template <class T>
__global__ void rope_kernel(T* x, const std::int32_t* positions, std::int64_t n, int heads,
                            int head_dim, rope_spec spec, float sign) {
  const int half = head_dim / 2;
  const std::int64_t total = n * heads * half;
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(k % half);
    const std::int64_t rh = k / half;  // row * heads + head
    const std::int64_t row = rh / heads;
    float c, sn;
    rope_angle(positions[row], i, head_dim, spec, c, sn);
    sn *= sign;
    T* x1 = x + rh * head_dim;  // row * (heads * head_dim) + head * head_dim
    T* x2 = x1 + half;
    float r1, r2;
    rope_rotate(load_f32(x1, i), load_f32(x2, i), c, sn, r1, r2);
    store_f32(x1, i, r1);
    store_f32(x2, i, r2);
  }
}

/// Item t of a RoPE-and-store launch: a q pair (rotated in place), a k pair
/// (rotated, or copied, into its cache row) or a v element (copied into its
/// cache row). `k_at(row)` / `v_at(row)` give where row's key / value goes
/// (type KT: f32, or bf16/f16 rounded once on store).
template <class KT, class KAt, class VAt>
__device__ __forceinline__ void rope_store_item(std::int64_t t, float* q, const float* k, const float* v,
                                                const std::int32_t* positions, std::int64_t q_items,
                                                std::int64_t k_items, int hq, int hkv, int head_dim,
                                                const rope_spec& spec, bool rotate, KAt k_at, VAt v_at) {
  const int half = head_dim / 2;
  const std::int64_t kw = std::int64_t{hkv} * head_dim;
  if (t >= q_items + k_items) {
    const std::int64_t e = t - q_items - k_items;
    store_f32(v_at(e / kw), e % kw, v[e]);
    return;
  }
  const bool is_q = t < q_items;
  const std::int64_t item = is_q ? t : t - q_items;
  const int i = static_cast<int>(item % half);
  const std::int64_t rh = item / half;  // row * heads + head
  const float* src = (is_q ? q : k) + rh * head_dim;
  rope_store_pair<KT>(is_q, rh, i, src[i], src[i + half], q, positions, hq, hkv, head_dim, spec, rotate, k_at);
}

/// One thread per q pair, k pair and v element (rope_store_item) of n rows
/// whose cache rows are consecutive: k_out and v_out, n rows each.
template <class KT>
__global__ void rope_store_kv_kernel(float* q, const float* k, const float* v, const std::int32_t* positions,
                                     std::int64_t n, int hq, int hkv, int head_dim, rope_spec spec, bool rotate,
                                     KT* k_out, KT* v_out) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  const int half = head_dim / 2;
  const std::int64_t kw = std::int64_t{hkv} * head_dim;
  const std::int64_t q_items = rotate ? n * hq * half : 0, k_items = n * hkv * half;
  const std::int64_t total = q_items + k_items + n * kw;
  const auto k_at = [=](std::int64_t row) { return k_out + row * kw; };
  const auto v_at = [=](std::int64_t row) { return v_out + row * kw; };
  for (std::int64_t t = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; t < total;
       t += std::int64_t{gridDim.x} * blockDim.x)
    rope_store_item<KT>(t, q, k, v, positions, q_items, k_items, hq, hkv, head_dim, spec, rotate, k_at, v_at);
}

/// The same for rows of different sequences (a server's decode batch): row
/// r's key and value go to k_rows[r] and v_rows[r] (device tables).
template <class KT>
__global__ void rope_store_kv_rows_kernel(float* q, const float* k, const float* v, const std::int32_t* positions,
                                          std::int64_t n, int hq, int hkv, int head_dim, rope_spec spec, bool rotate,
                                          KT* const* k_rows, KT* const* v_rows) {
  allow_dependents();
  await_producers();
  const int half = head_dim / 2;
  const std::int64_t q_items = rotate ? n * hq * half : 0, k_items = n * hkv * half;
  const std::int64_t total = q_items + k_items + n * hkv * head_dim;
  const auto k_at = [=](std::int64_t row) { return k_rows[row]; };
  const auto v_at = [=](std::int64_t row) { return v_rows[row]; };
  for (std::int64_t t = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; t < total;
       t += std::int64_t{gridDim.x} * blockDim.x)
    rope_store_item<KT>(t, q, k, v, positions, q_items, k_items, hq, hkv, head_dim, spec, rotate, k_at, v_at);
}

/// Where rope_store_kv_pages_kernel's rows go: row r is position
/// row_keys[r] - 1 of its paged cache, its key page p's pointer at
/// row_tables[r][k_offset + p * page_stride] (values: v_offset) (see
/// page_tables.hpp), pages of page_tokens rows.
template <class KT>
struct paged_rows {
  KT* const* const* row_tables;
  const std::int64_t* row_keys;
  std::int64_t k_offset, v_offset, page_stride, page_tokens;
};

/// The same for rows of different sequences whose cache rows are found
/// through their page tables (a decode batch of kv_sequences on the device:
/// nothing uploaded but the rows' table addresses, once a step).
template <class KT>
__global__ void rope_store_kv_pages_kernel(float* q, const float* k, const float* v, const std::int32_t* positions,
                                           std::int64_t n, int hq, int hkv, int head_dim, rope_spec spec, bool rotate,
                                           paged_rows<KT> d) {
  allow_dependents();
  await_producers();
  const int half = head_dim / 2;
  const std::int64_t kw = std::int64_t{hkv} * head_dim;
  const std::int64_t q_items = rotate ? n * hq * half : 0, k_items = n * hkv * half;
  const std::int64_t total = q_items + k_items + n * kw;
  const auto at = [=](std::int64_t row, std::int64_t entry) {
    const std::int64_t pos = d.row_keys[row] - 1;
    return d.row_tables[row][entry + pos / d.page_tokens * d.page_stride] + pos % d.page_tokens * kw;
  };
  const auto k_at = [=](std::int64_t row) { return at(row, d.k_offset); };
  const auto v_at = [=](std::int64_t row) { return at(row, d.v_offset); };
  for (std::int64_t t = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; t < total;
       t += std::int64_t{gridDim.x} * blockDim.x)
    rope_store_item<KT>(t, q, k, v, positions, q_items, k_items, hq, hkv, head_dim, spec, rotate, k_at, v_at);
}

}  // namespace
}  // namespace corolla::cuda
