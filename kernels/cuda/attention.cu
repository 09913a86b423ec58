// kernels/cuda/attention.cu — causal grouped-query attention: forward (also
// against a paged cache) and backward.
//
// One warp per (query row, head) in the forward: the lanes hold the query
// row and an output accumulator in registers (element d in lane d % 32),
// walk the visible keys in order with an online softmax in f32 (running max
// m and sum l rescaled as the max grows), and write out = acc / l and
// lse = m + log(l) (of the *scaled* scores, like the CPU backend).
//
// The backward recomputes probabilities from lse (P = exp(scale q.k - lse))
// with D = dout . out per row, dS = scale * P * (dout . v - D):
//   dq_i = sum_j dS_ij k_j        one warp per (query row, head)
//   dk_j = sum_{h, i>=j} dS_ij q_i, dv_j = sum_{h, i>=j} P_ij dout_i
//                                 one warp per (key row, kv head)
// Each warp owns the rows it writes: no atomics, deterministic.
//
// This is the straightforward O(T^2) formulation (attention_warp_kernels.cuh),
// chosen for being easy to check against kernels/cpu/cpu_attention.cpp; it
// re-reads keys from L2 per query row. Head sizes up to 128 take the tiled
// kernels of attention_tiled.cu instead, or attention_mma.cu's tensor-core
// ones (bf16 and f16 tensors, or f32 at bf16 matmul precision; the delta kernel
// here runs for all), and attention against the paged cache (decode) splits the keys
// over blocks (attention_paged_kernels.cuh).
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/attention_mma.hpp"
#include "kernels/cuda/attention_paged_kernels.cuh"
#include "kernels/cuda/attention_warp_kernels.cuh"
#include "kernels/cuda/attention_tiled.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/dispatch.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

namespace corolla::cuda {
namespace {

unsigned warp_blocks(std::int64_t warps) {
  return static_cast<unsigned>((warps + warps_per_block - 1) / warps_per_block);
}

/// Calls f(std::integral_constant<int, C>) with C = registers per lane for dh.
template <class F>
void dispatch_chunks(std::int64_t dh, F&& f) {
  if (dh <= 32) return f(std::integral_constant<int, 1>{});
  if (dh <= 64) return f(std::integral_constant<int, 2>{});
  if (dh <= 128) return f(std::integral_constant<int, 4>{});
  if (dh <= max_head_dim) return f(std::integral_constant<int, 8>{});
  throw std::invalid_argument("attention: head_dim " + std::to_string(dh) +
                              " is above the CUDA kernels' limit of " +
                              std::to_string(max_head_dim));
}

}  // namespace

// ---- launchers -------------------------------------------------------------------

namespace {

/// Whether attention of storage t tries the tensor-core kernels: bf16 and
/// f16 tensors always (their values are 16-bit already; f16 tiles multiply
/// in f16), f32 ones at bf16 matmul precision (`tensor_cores`: rounding them
/// to bf16 is then what was asked for).
bool takes_tensor_cores(elem t, bool tensor_cores) {
  return t == elem::bf16 || t == elem::f16 || (t == elem::f32 && tensor_cores);
}

}  // namespace

void attention_forward(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                       const void* v, std::int64_t batch, std::int64_t seq, void* out, float* lse,
                       bool tensor_cores) {
  if (batch * seq <= 0) return;
  if (takes_tensor_cores(t, tensor_cores) && attention_forward_mma(s, g, t, q, k, v, batch, seq, out, lse)) return;
  if (attention_forward_tiled(s, g, t, q, k, v, batch, seq, out, lse)) return;
  dispatch_chunks(g.dh, [&](auto c) {
    dispatch_elem(t, [&](auto tag) {
      using T = decltype(tag);
      forward_params<T> p;
      p.q = static_cast<const T*>(q);
      p.out = static_cast<T*>(out);
      p.lse = lse;
      p.k = static_cast<const T*>(k);
      p.v = static_cast<const T*>(v);
      p.rows = batch * seq;
      p.seq = seq;
      p.g = g;
      attention_forward_kernel<decltype(c)::value, T><<<warp_blocks(p.rows * g.hq), attn_threads, 0, s>>>(p);
      COROLLA_CUDA_LAUNCH_CHECK("attention_forward_kernel");
    });
  });
}

void attention_backward(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                        const void* v, const void* out, const float* lse, const void* dout,
                        std::int64_t batch, std::int64_t seq, void* dq, void* dk, void* dv, float* delta,
                        bool tensor_cores) {
  const std::int64_t rows = batch * seq;
  if (rows <= 0) return;
  dispatch_chunks(g.dh, [&](auto c) {
    constexpr int C = decltype(c)::value;
    dispatch_elem(t, [&](auto tag) {
      using T = decltype(tag);
      const backward_params<T> p{static_cast<const T*>(q),    static_cast<const T*>(k),
                                 static_cast<const T*>(v),    static_cast<const T*>(out),
                                 lse,                         static_cast<const T*>(dout),
                                 static_cast<T*>(dq),         static_cast<T*>(dk),
                                 static_cast<T*>(dv),         delta,
                                 batch,                       seq,
                                 g};
      attention_delta_kernel<C, T><<<warp_blocks(rows * g.hq), attn_threads, 0, s>>>(p);
      COROLLA_CUDA_LAUNCH_CHECK("attention_delta_kernel");
      if (takes_tensor_cores(t, tensor_cores) &&
          attention_backward_mma(s, g, t, q, k, v, lse, dout, delta, batch, seq, dq, dk, dv))
        return;
      if (attention_backward_tiled(s, g, t, q, k, v, lse, dout, delta, batch, seq, dq, dk, dv)) return;
      attention_dq_kernel<C, T><<<warp_blocks(rows * g.hq), attn_threads, 0, s>>>(p);
      COROLLA_CUDA_LAUNCH_CHECK("attention_dq_kernel");
      attention_dkdv_kernel<C, T><<<warp_blocks(rows * g.hkv), attn_threads, 0, s>>>(p);
      COROLLA_CUDA_LAUNCH_CHECK("attention_dkdv_kernel");
    });
  });
}

std::size_t attention_cached_scratch_bytes(const attention_dims& g, std::int64_t tq,
                                           std::int64_t start_pos) {
  const std::int64_t splits = attention_cached_splits(tq, start_pos);
  if (splits <= 1) return 0;
  return static_cast<std::size_t>(tq * g.hq * splits * (g.dh + 2)) * sizeof(float);
}

namespace {

/// The split-key kernel over every (row, head) and chunk, then with several
/// chunks the combine kernel.
template <class KT>
void launch_paged(stream_t s, const paged_params<KT>& p) {
  const std::int64_t heads = p.rows * p.g.hq;
  dispatch_chunks(p.g.dh, [&](auto c) {
    constexpr int C = decltype(c)::value;
    const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(p.splits));
    launch_dependent("attention_paged_split_kernel", &attention_paged_split_kernel<C, KT>,
        grid, dim3(split_warps * 32), 0, s, p);
    if (p.splits > 1) {
      launch_dependent("attention_paged_combine_kernel", &attention_paged_combine_kernel<C>,
          dim3(warp_blocks(heads)), dim3(attn_threads), 0, s, static_cast<const paged_common&>(p));
    }
  });
}

/// A paged-attention call of `rows` query rows with `splits` key chunks;
/// with several, the partial states go to `scratch`.
template <class KT>
paged_params<KT> paged_call(const attention_dims& g, const float* q, float* out, std::int64_t page_stride,
                            std::int64_t page_tokens, std::int64_t rows, std::int64_t splits, float* scratch) {
  paged_params<KT> p;
  p.q = q;
  p.out = out;
  p.page_stride = page_stride;
  p.page_tokens = page_tokens;
  p.rows = rows;
  p.splits = splits;
  p.g = g;
  p.part_acc = scratch;
  p.part_ml = splits > 1 ? scratch + rows * g.hq * splits * g.dh : nullptr;
  return p;
}

}  // namespace

void attention_cached(stream_t s, const attention_dims& g, const float* q, std::int64_t tq, elem cache,
                      const void* const* k_pages, const void* const* v_pages, std::int64_t page_stride,
                      std::int64_t page_tokens, std::int64_t start_pos, float* out, float* scratch) {
  if (tq <= 0) return;
  dispatch_elem(cache, [&](auto tag) {
    using KT = decltype(tag);
    auto p = paged_call<KT>(g, q, out, page_stride, page_tokens, tq, attention_cached_splits(tq, start_pos), scratch);
    p.k_pages = reinterpret_cast<const KT* const*>(k_pages);
    p.v_pages = reinterpret_cast<const KT* const*>(v_pages);
    p.start_pos = start_pos;
    launch_paged(s, p);
  });
}

std::int64_t attention_cached_key_chunks(std::int64_t tq, std::int64_t start_pos) {
  return attention_cached_splits(tq, start_pos);
}

void attention_cached_batch(stream_t s, const attention_dims& g, const float* q, std::int64_t n, elem cache,
                            const batch_page_tables& t, std::int64_t page_tokens, std::int64_t splits, float* out,
                            float* scratch) {
  if (n <= 0) return;
  dispatch_elem(cache, [&](auto tag) {
    using KT = decltype(tag);
    auto p = paged_call<KT>(g, q, out, t.page_stride, page_tokens, n, splits, scratch);
    p.row_tables = reinterpret_cast<const KT* const* const*>(t.row_tables);
    p.row_keys = t.row_keys;
    p.k_offset = t.k_offset;
    p.v_offset = t.v_offset;
    launch_paged(s, p);
  });
}

}  // namespace corolla::cuda
