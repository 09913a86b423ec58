// kernels/cuda/attention_tiled.cu — causal grouped-query attention for
// training (contiguous q, k, v), tiled through shared memory.
//
// Flash-attention's structure in f32 on the SIMT cores: a block of 8 warps
// owns a tile of 32 rows (queries, or keys for dk/dv) and walks the 32-row
// tiles of the other side that the causal mask leaves visible, staging both
// in shared memory, so each K/V (or Q/dO) row is read from global memory
// once per tile instead of once per row of the other side as in
// attention.cu's warp-per-row kernels. Within a tile a warp owns 4 rows and
// lane j the row j of the other tile: a score is one lane's dot product over
// shared memory (rows padded to an odd stride: no bank conflicts), the
// softmax statistics are warp reductions, and the products with V (or Q,
// dO, K) broadcast each lane's coefficient with a shuffle.
//
//   forward   out, lse with an online softmax per query row
//   dq        per query tile over key tiles: dq = scale * sum_j dS_ij k_j
//   dk, dv    per key tile over the query tiles of every head of its group:
//             dk = scale * sum dS_ij q_i, dv = sum P_ij dO_i
// with P_ij = exp(scale q_i.k_j - lse_i), dS_ij = P_ij (dO_i.v_j - delta_i).
// Each block writes only its own rows: no atomics, deterministic. Head sizes
// up to 128; attention.cu's kernels take the rest. The kernels are in
// attention_tiled_kernels.cuh.
#include "kernels/cuda/attention_tiled.hpp"

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/attention_tiled_kernels.cuh"

namespace corolla::cuda {
namespace {

/// Calls f(std::integral_constant<int, C>{}, T{}) with C = registers per
/// lane for dh and T the device type of storage `t`; false (nothing called)
/// when dh exceeds tiled_max_head_dim.
template <class F>
bool dispatch_tiled(std::int64_t dh, elem t, F&& f) {
  auto with = [&](auto c) { dispatch_elem(t, [&](auto tag) { f(c, tag); }); };
  if (dh <= 32) return with(std::integral_constant<int, 1>{}), true;
  if (dh <= 64) return with(std::integral_constant<int, 2>{}), true;
  if (dh <= tiled_max_head_dim) return with(std::integral_constant<int, 4>{}), true;
  return false;
}

/// What both directions pass: q, k, v and the geometry.
template <class T>
tiled_args<T> args_of(const void* q, const void* k, const void* v, std::int64_t batch, std::int64_t seq,
                      const attention_dims& g) {
  tiled_args<T> a{};
  a.q = static_cast<const T*>(q);
  a.k = static_cast<const T*>(k);
  a.v = static_cast<const T*>(v);
  a.batch = batch;
  a.seq = seq;
  a.g = g;
  return a;
}

}  // namespace

bool attention_forward_tiled(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                             const void* v, std::int64_t batch, std::int64_t seq, void* out, float* lse) {
  if (tiles_of(seq) > max_grid_y) return false;  // query tiles go along gridDim.y: the warp kernels take it
  return dispatch_tiled(g.dh, t, [&](auto c, auto tag) {
    constexpr int C = decltype(c)::value;
    using T = decltype(tag);
    tiled_args<T> a = args_of<T>(q, k, v, batch, seq, g);
    a.out_w = static_cast<T*>(out);
    a.lse_w = lse;
    const std::size_t smem = tiled_smem<C>(3);
    allow_smem(flash_forward_kernel<C, T>, smem);  // once per device (the limit is per device)
    const dim3 grid(static_cast<unsigned>(batch * g.hq), tiles_of(seq));
    flash_forward_kernel<C, T><<<grid, tile_threads, smem, s>>>(a);
    COROLLA_CUDA_LAUNCH_CHECK("flash_forward_kernel");
  });
}

bool attention_backward_tiled(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                              const void* v, const float* lse, const void* dout, const float* delta,
                              std::int64_t batch, std::int64_t seq, void* dq, void* dk, void* dv) {
  if (tiles_of(seq) > max_grid_y) return false;
  return dispatch_tiled(g.dh, t, [&](auto c, auto tag) {
    constexpr int C = decltype(c)::value;
    using T = decltype(tag);
    tiled_args<T> a = args_of<T>(q, k, v, batch, seq, g);
    a.lse = lse;
    a.dout = static_cast<const T*>(dout);
    a.delta = delta;
    a.dq = static_cast<T*>(dq);
    a.dk = static_cast<T*>(dk);
    a.dv = static_cast<T*>(dv);
    const std::size_t smem = tiled_smem<C>(4);
    allow_smem(flash_dq_kernel<C, T>, smem);
    allow_smem(flash_dkdv_kernel<C, T>, smem);
    flash_dq_kernel<C, T><<<dim3(static_cast<unsigned>(batch * g.hq), tiles_of(seq)), tile_threads, smem, s>>>(a);
    COROLLA_CUDA_LAUNCH_CHECK("flash_dq_kernel");
    flash_dkdv_kernel<C, T><<<dim3(static_cast<unsigned>(batch * g.hkv), tiles_of(seq)), tile_threads, smem, s>>>(a);
    COROLLA_CUDA_LAUNCH_CHECK("flash_dkdv_kernel");
  });
}

}  // namespace corolla::cuda
