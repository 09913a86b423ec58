// kernels/cuda/attention_mma.cu — causal grouped-query attention for
// training on the tensor cores (bf16 x bf16 or f16 x f16 -> f32, sm_80 and
// newer), in two kernel families with the same walk, tiles and roundings:
//   * the register kernels of attention_fa_kernels.cuh (the default):
//     mma.sync with documented register layouts, so scores, softmax, P and
//     dS and the output's rescaling never leave registers (its file comment
//     says how);
//   * the WMMA kernels of attention_mma_kernels.cuh, described below, which
//     go through shared memory for each of those. COROLLA_ATTENTION_KERNELS=
//     wmma selects them (`corolla bench attention --kernels fa,wmma` times
//     both in one run).
//
// The structure of attention_tiled.cu (flash-attention: a block owns one
// tile and walks the tiles of the other side that the causal mask leaves
// visible; no atomics, deterministic), with the products on the tensor
// cores:
//   * a block has 4 warps and owns a 64-row tile; each warp owns 16 rows.
//     Tiles are staged in shared memory as 16-bit values (bf16 converted
//     from f32 tensors while loading; bf16 and f16 tensors as they are),
//     rows padded by 8 elements against bank conflicts;
//   * a warp's 16 x 64 score block (and dP) is a 16x16x16 WMMA product over
//     the head size, stored to the warp's own f32 scratch. Lanes 2r and 2r+1
//     then own row r, 32 columns each: the mask, the exponentials and the
//     softmax statistics are f32 arithmetic on the stored scores, and the
//     probabilities (or dS) go back to shared memory in the tiles' 16-bit
//     type for the next product;
//   * forward: the P.V product of a key tile is a fresh accumulator stored
//     to scratch and folded into the lanes' f32 output rows with the online
//     softmax correction (WMMA accumulators have no documented element
//     order, so they are never rescaled in place);
//   * dq (per query tile) and dk, dv (per key tile, over every query head
//     of its group) accumulate in WMMA fragments across the whole walk.
// Row statistics as attention.cu: lse natural-log, [b][h][t]; delta =
// dout . out per row and head. Exponentials are exp2 of log2e-scaled values.
//
// Storage: f32 tensors (rounded to bf16 as tiles are staged), bf16 ones
// (staged as they are; outputs rounded once on store), so a bf16 tensor
// gives exactly the f32 tensor's results, rounded; or f16 ones, whose tiles,
// P and dS are f16 (mixed-precision training in f16).
//
// Accuracy: q, k, v, dout, P and dS are rounded to bf16 (8-bit significand;
// f16 tensors: f16, 11 bits) before each product; sums and statistics are
// f32. Errors are those of a 16-bit GEMM of the same depth
// (tests/kernels/cuda_attention_mma.cpp gives the bound). f16 P and dS flush
// below 6e-8 to zero and overflow above 65504: with loss scaling, an
// overflow skips the step.
#include "kernels/cuda/attention_mma.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_fa_kernels.cuh"
#include "kernels/cuda/attention_mma_kernels.cuh"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"

namespace corolla::cuda {
namespace {

/// Calls f(integral_constant<int, D>) for the head sizes with kernels.
template <class F>
bool dispatch_heads(std::int64_t dh, F&& f) {
  switch (dh) {
    case 32: return f(std::integral_constant<int, 32>{}), true;
    case 64: return f(std::integral_constant<int, 64>{}), true;
    case 96: return f(std::integral_constant<int, 96>{}), true;
    case 128: return f(std::integral_constant<int, 128>{}), true;
    default: return false;
  }
}

/// Whether the image of the forward kernel that runs on the current device
/// was compiled for sm_80 or newer (its SASS, and the PTX it could be
/// JIT-compiled from): a binary built for older architectures too has empty
/// kernels there. Once per device (a multi-architecture build may serve
/// GPUs of different generations).
bool compiled_for_tensor_cores() {
  static std::mutex mu;
  static std::map<int, bool> by_device;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  std::lock_guard lock(mu);
  if (auto it = by_device.find(dev); it != by_device.end()) return it->second;
  cudaFuncAttributes fa{};
  bool yes = false;
  if (cudaFuncGetAttributes(&fa, mma_forward_kernel<64, float>) == cudaSuccess)
    yes = fa.binaryVersion >= 80 && fa.ptxVersion >= 80;
  else
    (void)cudaGetLastError();  // no image for this device: the caller falls back
  by_device.emplace(dev, yes);
  return yes;
}

/// Whether blocks with `bytes` of dynamic shared memory fit the current
/// device's opt-in limit (227 KiB on sm_90, 163 on sm_80, but 99 on sm_86,
/// sm_89 and sm_120: head size 128's backward needs 103 KiB with the
/// register kernels, 102.5 with the WMMA ones).
bool fits_shared_memory(std::size_t bytes) {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return static_cast<std::size_t>(optin) >= bytes;
}

unsigned tiles_of(std::int64_t seq) { return static_cast<unsigned>((seq + tile - 1) / tile); }

}  // namespace

mma_attention_kernels mma_attention_kernels_in_use() {
  const char* e = std::getenv("COROLLA_ATTENTION_KERNELS");
  if (e == nullptr || std::strcmp(e, "") == 0 || std::strcmp(e, "fa") == 0) return mma_attention_kernels::fa;
  if (std::strcmp(e, "wmma") == 0) return mma_attention_kernels::wmma;
  throw std::invalid_argument("COROLLA_ATTENTION_KERNELS='" + std::string(e) + "': expected fa or wmma");
}

namespace {

/// attention_mma_supported for the kernel family `family`.
bool supported_for(mma_attention_kernels family, const attention_dims& g,
                   std::initializer_list<const void*> pointers) {
  std::size_t smem = 0;  // the backward kernels' blocks, the larger ones
  const bool fa = family == mma_attention_kernels::fa;
  if (!dispatch_heads(g.dh, [&](auto d) {
        constexpr int D = decltype(d)::value;
        smem = fa ? fa_layout<D>::backward_bytes : layout<D>::bytes(4);
      }))
    return false;
  for (const void* p : pointers)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return compiled_for_tensor_cores() && fits_shared_memory(smem);
}

}  // namespace

bool attention_mma_supported(const attention_dims& g, std::initializer_list<const void*> pointers) {
  return supported_for(mma_attention_kernels_in_use(), g, pointers);
}

namespace {

/// Calls f(T{}) for the storage types with kernels (f32, bf16, f16); others
/// were refused by the callers (launches).
template <class F>
void dispatch_storage(elem t, F&& f) {
  if (t == elem::bf16)
    f(bf16{});
  else if (t == elem::f16)
    f(__half{});
  else
    f(float{});
}

/// Whether the launchers take a call of storage t on these pointers with
/// kernel family `family`: f32, bf16 or f16, supported (as
/// attention_mma_supported), and query tiles within gridDim.y (longer
/// sequences take the warp kernels).
bool launches(mma_attention_kernels family, elem t, const attention_dims& g,
              std::initializer_list<const void*> pointers, std::int64_t seq) {
  return (t == elem::f32 || t == elem::bf16 || t == elem::f16) && supported_for(family, g, pointers) &&
         (seq + tile - 1) / tile <= max_grid_y;
}

/// The kernels' arguments with q, k, v, the sequence and the geometry filled.
template <class T>
mma_args<T> args_of(const void* q, const void* k, const void* v, std::int64_t seq, const attention_dims& g) {
  mma_args<T> a{};
  a.q = static_cast<const T*>(q);
  a.k = static_cast<const T*>(k);
  a.v = static_cast<const T*>(v);
  a.seq = seq;
  a.g = g;
  return a;
}

}  // namespace

bool attention_forward_mma(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                           const void* v, std::int64_t batch, std::int64_t seq, void* out, float* lse) {
  const mma_attention_kernels family = mma_attention_kernels_in_use();  // read once per call
  if (!launches(family, t, g, {q, k, v, out}, seq)) return false;
  const bool fa = family == mma_attention_kernels::fa;
  bool launched = false;
  dispatch_storage(t, [&](auto tag) {
    using T = decltype(tag);
    mma_args<T> a = args_of<T>(q, k, v, seq, g);
    a.out = static_cast<T*>(out);
    a.lse_w = lse;
    const dim3 grid(static_cast<unsigned>(batch * g.hq), tiles_of(seq));
    launched = dispatch_heads(g.dh, [&](auto d) {
      constexpr int D = decltype(d)::value;
      if (fa) {
        const std::size_t smem = fa_layout<D>::forward_bytes;
        allow_smem(fa_forward_kernel<D, T>, smem);  // once per device (the limit is per device)
        fa_forward_kernel<D, T><<<grid, threads, smem, s>>>(a);
        COROLLA_CUDA_LAUNCH_CHECK("fa_forward_kernel");
        return;
      }
      const std::size_t smem = layout<D>::bytes(3);
      allow_smem(mma_forward_kernel<D, T>, smem);
      mma_forward_kernel<D, T><<<grid, threads, smem, s>>>(a);
      COROLLA_CUDA_LAUNCH_CHECK("mma_forward_kernel");
    });
  });
  return launched;
}

bool attention_backward_mma(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                            const void* v, const float* lse, const void* dout, const float* delta,
                            std::int64_t batch, std::int64_t seq, void* dq, void* dk, void* dv) {
  const mma_attention_kernels family = mma_attention_kernels_in_use();  // read once per call
  if (!launches(family, t, g, {q, k, v, dout, dq, dk, dv}, seq)) return false;
  const bool fa = family == mma_attention_kernels::fa;
  bool launched = false;
  dispatch_storage(t, [&](auto tag) {
    using T = decltype(tag);
    mma_args<T> a = args_of<T>(q, k, v, seq, g);
    a.lse = lse;
    a.dout = static_cast<const T*>(dout);
    a.delta = delta;
    a.dq = static_cast<T*>(dq);
    a.dk = static_cast<T*>(dk);
    a.dv = static_cast<T*>(dv);
    const dim3 q_grid(static_cast<unsigned>(batch * g.hq), tiles_of(seq));
    const dim3 kv_grid(static_cast<unsigned>(batch * g.hkv), tiles_of(seq));
    launched = dispatch_heads(g.dh, [&](auto d) {
      constexpr int D = decltype(d)::value;
      if (fa) {
        const std::size_t smem = fa_layout<D>::backward_bytes;
        allow_smem(fa_dq_kernel<D, T>, smem);
        allow_smem(fa_dkdv_kernel<D, T>, smem);
        fa_dq_kernel<D, T><<<q_grid, threads, smem, s>>>(a);
        COROLLA_CUDA_LAUNCH_CHECK("fa_dq_kernel");
        fa_dkdv_kernel<D, T><<<kv_grid, threads, smem, s>>>(a);
        COROLLA_CUDA_LAUNCH_CHECK("fa_dkdv_kernel");
        return;
      }
      const std::size_t smem = layout<D>::bytes(4);
      allow_smem(mma_dq_kernel<D, T>, smem);
      allow_smem(mma_dkdv_kernel<D, T>, smem);
      mma_dq_kernel<D, T><<<q_grid, threads, smem, s>>>(a);
      COROLLA_CUDA_LAUNCH_CHECK("mma_dq_kernel");
      mma_dkdv_kernel<D, T><<<kv_grid, threads, smem, s>>>(a);
      COROLLA_CUDA_LAUNCH_CHECK("mma_dkdv_kernel");
    });
  });
  return launched;
}

}  // namespace corolla::cuda
