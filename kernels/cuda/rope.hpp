// kernels/cuda/rope.hpp — rotary position embedding launcher (host-only).
#pragma once

#include <cstdint>

#include "kernels/cuda/page_tables.hpp"
#include "kernels/cuda/stream.hpp"
#include "kernels/rope_spec.hpp"

namespace corolla::cuda {

/// In place on x [n, heads*head_dim] (element type t, rotated in f32):
/// pair (i, i + head_dim/2) of each head rotated by positions[row] *
/// spec.inv_freq(i, head_dim) (negated when `inverse`) and scaled by
/// spec.scale(). Positions (device, i32) must be non-negative: checked by
/// the caller.
void rope(stream_t s, elem t, void* x, const std::int32_t* positions, std::int64_t n, int heads,
          int head_dim, const rope_spec& spec, bool inverse);

/// Backend::rope_store_kv on device pointers: q [n, hq*head_dim] rotated in
/// place (when `rotate`), k [n, hkv*head_dim] rotated (or copied) into
/// k_out, v copied into v_out (cache rows of element type `cache`, rounded
/// once on store); one launch.
void rope_store_kv(stream_t s, float* q, const float* k, const float* v, const std::int32_t* positions,
                   std::int64_t n, int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, elem cache,
                   void* k_out, void* v_out);
/// The same for rows of different sequences: row r's key and value go to
/// k_rows[r] and v_rows[r] (device tables of n device pointers each).
void rope_store_kv_rows(stream_t s, float* q, const float* k, const float* v, const std::int32_t* positions,
                        std::int64_t n, int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, elem cache,
                        void* const* k_rows, void* const* v_rows);
/// The same with row r's key and value going to position row_keys[r] - 1 of
/// its paged cache (`t`; pages of `page_tokens` tokens).
void rope_store_kv_pages(stream_t s, float* q, const float* k, const float* v, const std::int32_t* positions,
                         std::int64_t n, int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, elem cache,
                         const batch_page_tables& t, std::int64_t page_tokens);

}  // namespace corolla::cuda
