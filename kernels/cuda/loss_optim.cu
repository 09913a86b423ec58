// kernels/cuda/loss_optim.cu — softmax cross-entropy (one block per row) and
// the AdamW step (elementwise, four parameters a thread from the first
// 16-byte boundary on).
// Formulas as in kernels/cpu/cpu_loss_optim.cpp.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/loss_optim_kernels.cuh"
#include "kernels/cuda/loss_optim.hpp"

namespace corolla::cuda {

void cross_entropy(stream_t s, elem t, const void* logits, const std::int32_t* targets, float* losses,
                   void* dlogits, float grad_scale, std::int64_t n, std::int64_t vocab) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<static_cast<unsigned>(n), ce_threads, 0, s>>>(
        static_cast<const T*>(logits), targets, losses, static_cast<T*>(dlogits), grad_scale, vocab);
    COROLLA_CUDA_LAUNCH_CHECK("cross_entropy_kernel");
  });
}

namespace {

std::uintptr_t misalignment(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16; }

/// adamw_vec4_kernel where params, grads, m and v share one alignment
/// modulo 16 bytes (the flat buffers, and a data-parallel rank's shard of
/// them, which starts anywhere): the parameters before the first 16-byte
/// boundary (at most three) by adamw_kernel, the rest four a thread.
/// Otherwise, or with COROLLA_CUDA_ADAMW_VEC4=0 in the environment (the A/B
/// and the fallback should the four-a-thread kernel fail on a GPU),
/// adamw_kernel throughout. Either way the same bits.
template <class CT>
void launch_adamw(stream_t s, float* params, const float* grads, float* m, float* v, CT* copy,
                  const adamw_step_scalars& k, std::int64_t n) {
  const std::uintptr_t off = misalignment(params);
  static const bool vec4 = env_switch("COROLLA_CUDA_ADAMW_VEC4", true);
  const bool shared =
      vec4 && off % 4 == 0 && misalignment(grads) == off && misalignment(m) == off && misalignment(v) == off;
  std::int64_t head = shared ? static_cast<std::int64_t>((16 - off) % 16 / 4) : n;
  if (head > n) head = n;
  if (head > 0) {
    adamw_kernel<CT><<<grid_for(head), elementwise_threads, 0, s>>>(params, grads, m, v, copy, k, head);
    COROLLA_CUDA_LAUNCH_CHECK("adamw_kernel");
  }
  if (n > head) {
    CT* rest_copy = nullptr;
    if constexpr (!std::is_same_v<CT, adamw_no_copy>) rest_copy = copy + head;
    adamw_vec4_kernel<CT><<<grid_for((n - head) / 4), elementwise_threads, 0, s>>>(
        params + head, grads + head, m + head, v + head, rest_copy, k, n - head);
    COROLLA_CUDA_LAUNCH_CHECK("adamw_vec4_kernel");
  }
}

}  // namespace

void adamw(stream_t s, float* params, const float* grads, float* m, float* v,
           const adamw_step_scalars& k, std::int64_t n) {
  if (n <= 0) return;
  launch_adamw<adamw_no_copy>(s, params, grads, m, v, nullptr, k, n);
}

void adamw_with_copy(stream_t s, float* params, const float* grads, float* m, float* v, elem copy_type, void* copy,
                     const adamw_step_scalars& k, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(copy_type, [&](auto tag) {
    using CT = decltype(tag);
    launch_adamw<CT>(s, params, grads, m, v, static_cast<CT*>(copy), k, n);
  });
}

}  // namespace corolla::cuda
