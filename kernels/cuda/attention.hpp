// kernels/cuda/attention.hpp — causal grouped-query attention launchers
// (host-only; device pointers; layouts as in kernels/backend.hpp and lse
// ordered [b][h][t] like the CPU backend).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/page_tables.hpp"
#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Largest head_dim the kernels take (a warp holds a row in registers,
/// 8 elements per lane).
constexpr int max_head_dim = 256;

/// Geometry of one attention call (validated by the caller).
struct attention_dims {
  std::int64_t hq = 0, hkv = 0, dh = 0, group = 0, q_width = 0, kv_width = 0;
  float scale = 0.0f;
};

/// out, lse (may be null) for q [B*T, Hq*Dh] against k, v [B*T, Hkv*Dh];
/// q, k, v, out of element type t (read into f32, out rounded once), lse
/// f32. attention_mma.cu's tensor-core kernels run for bf16 and f16
/// operands, and for f32 ones with `tensor_cores` (bf16 matmul precision),
/// where they take the geometry (attention_mma_supported); otherwise the
/// f32-arithmetic kernels.
void attention_forward(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                       const void* v, std::int64_t batch, std::int64_t seq, void* out, float* lse,
                       bool tensor_cores);

/// dq, dk, dv (overwritten; all tensors of element type t but lse and
/// delta, f32). `delta` is scratch of B*Hq*T floats; `tensor_cores` as
/// attention_forward.
void attention_backward(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                        const void* v, const void* out, const float* lse, const void* dout,
                        std::int64_t batch, std::int64_t seq, void* dq, void* dk, void* dv, float* delta,
                        bool tensor_cores);

/// out [tq, Hq*Dh] for q [tq, Hq*Dh] at positions start_pos.. against a
/// paged cache: k_pages/v_pages are *device* arrays of device page pointers
/// (page p's at [p * page_stride]), page p holding tokens
/// [p*page_tokens, (p+1)*page_tokens) as rows of Hkv*Dh elements of type
/// `cache` (f32, bf16 or f16; read into f32).
/// The keys are split in chunks of 64 over thread blocks; with more than
/// one chunk the partial softmax states go to `scratch`, of
/// attention_cached_scratch_bytes(g, tq, start_pos) bytes (0: may be null).
void attention_cached(stream_t s, const attention_dims& g, const float* q, std::int64_t tq, elem cache,
                      const void* const* k_pages, const void* const* v_pages, std::int64_t page_stride,
                      std::int64_t page_tokens, std::int64_t start_pos, float* out, float* scratch);
std::size_t attention_cached_scratch_bytes(const attention_dims& g, std::int64_t tq,
                                           std::int64_t start_pos);
/// Key chunks (thread blocks per row and head) of a call with tq query rows
/// from start_pos.
std::int64_t attention_cached_key_chunks(std::int64_t tq, std::int64_t start_pos);
/// The same for `n` sequences of one query row each (a decode batch), in one
/// launch: row r of q against its own pages (`t`). `splits` is the most key
/// chunks of any row (attention_cached_key_chunks(1, position)); with more
/// than one, `scratch` holds n * Hq * splits * (Dh + 2) floats.
void attention_cached_batch(stream_t s, const attention_dims& g, const float* q, std::int64_t n, elem cache,
                            const batch_page_tables& t, std::int64_t page_tokens, std::int64_t splits, float* out,
                            float* scratch);

}  // namespace corolla::cuda
