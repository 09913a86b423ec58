// kernels/cuda/rope.cu — rotary position embedding (HuggingFace rotate-half).
// The angle is computed in double and cos/sin rounded to f32 once, exactly
// as kernels/cpu/cpu_rope.cpp builds its tables, so both backends rotate by
// the same f32 cos/sin (up to the last bit of the two libms' double
// cos/sin); no table is kept on the device.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/rope_kernels.cuh"
#include "kernels/cuda/rope.hpp"

namespace corolla::cuda {

namespace {

/// Threads of a RoPE-and-store launch: a q pair each (when rotating), a k
/// pair each, a v element each.
std::int64_t rope_store_threads(std::int64_t n, int hq, int hkv, int head_dim, bool rotate) {
  return (rotate ? n * hq * (head_dim / 2) : 0) + n * hkv * (head_dim / 2) + n * hkv * head_dim;
}

}  // namespace

void rope_store_kv(stream_t s, float* q, const float* k, const float* v, const std::int32_t* positions,
                   std::int64_t n, int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, elem cache,
                   void* k_out, void* v_out) {
  const std::int64_t total = rope_store_threads(n, hq, hkv, head_dim, rotate);
  if (total <= 0) return;
  dispatch_elem(cache, [&](auto tag) {
    using KT = decltype(tag);
    launch_dependent("rope_store_kv_kernel", &rope_store_kv_kernel<KT>,
        dim3(grid_for(total)), dim3(elementwise_threads), 0, s,
        q, k, v, positions, n, hq, hkv, head_dim, spec, rotate, static_cast<KT*>(k_out),
        static_cast<KT*>(v_out));
  });
}

void rope_store_kv_rows(stream_t s, float* q, const float* k, const float* v, const std::int32_t* positions,
                        std::int64_t n, int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, elem cache,
                        void* const* k_rows, void* const* v_rows) {
  const std::int64_t total = rope_store_threads(n, hq, hkv, head_dim, rotate);
  if (total <= 0) return;
  dispatch_elem(cache, [&](auto tag) {
    using KT = decltype(tag);
    launch_dependent("rope_store_kv_rows_kernel", &rope_store_kv_rows_kernel<KT>,
        dim3(grid_for(total)), dim3(elementwise_threads), 0, s,
        q, k, v, positions, n, hq, hkv, head_dim, spec, rotate, reinterpret_cast<KT* const*>(k_rows),
        reinterpret_cast<KT* const*>(v_rows));
  });
}

void rope_store_kv_pages(stream_t s, float* q, const float* k, const float* v, const std::int32_t* positions,
                         std::int64_t n, int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, elem cache,
                         const batch_page_tables& t, std::int64_t page_tokens) {
  const std::int64_t total = rope_store_threads(n, hq, hkv, head_dim, rotate);
  if (total <= 0) return;
  dispatch_elem(cache, [&](auto tag) {
    using KT = decltype(tag);
    launch_dependent("rope_store_kv_pages_kernel", &rope_store_kv_pages_kernel<KT>,
        dim3(grid_for(total)), dim3(elementwise_threads), 0, s,
        q, k, v, positions, n, hq, hkv, head_dim, spec, rotate,
        paged_rows<KT>{reinterpret_cast<KT* const* const*>(static_cast<const void*>(t.row_tables)), t.row_keys,
                       t.k_offset, t.v_offset, t.page_stride, page_tokens});
  });
}

void rope(stream_t s, elem t, void* x, const std::int32_t* positions, std::int64_t n, int heads,
          int head_dim, const rope_spec& spec, bool inverse) {
  const std::int64_t total = n * heads * (head_dim / 2);
  if (total <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid_for(total), elementwise_threads, 0, s>>>(
        static_cast<T*>(x), positions, n, heads, head_dim, spec, inverse ? -1.0f : 1.0f);
    COROLLA_CUDA_LAUNCH_CHECK("rope_kernel");
  });
}

}  // namespace corolla::cuda
