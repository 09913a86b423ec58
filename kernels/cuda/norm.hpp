// kernels/cuda/norm.hpp — RMSNorm and LayerNorm launchers (host-only; f32
// tensors, device pointers, [n, d] row-major).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// y = x * rstd * w per row; rstd[r] saved when rstd is not null.
void rmsnorm_forward(stream_t s, const float* x, const float* w, float eps, float* y,
                     float* rstd, std::int64_t n, std::int64_t d);
/// sum = a + b and y = rmsnorm(sum) for [n, d] rows (no rstd).
void add_rmsnorm(stream_t s, const float* a, const float* b, float* sum, const float* w, float eps, float* y,
                 std::int64_t n, std::int64_t d);
/// dx overwritten, dw accumulated.
void rmsnorm_backward(stream_t s, const float* x, const float* w, const float* rstd,
                      const float* dy, float* dx, float* dw, std::int64_t n, std::int64_t d);
/// y = (x - mean) * rstd * w + b per row; mean/rstd saved when not null.
void layernorm_forward(stream_t s, const float* x, const float* w, const float* b, float eps,
                       float* y, float* mean, float* rstd, std::int64_t n, std::int64_t d);
/// dx overwritten, dw and db accumulated.
void layernorm_backward(stream_t s, const float* x, const float* w, const float* mean,
                        const float* rstd, const float* dy, float* dx, float* dw, float* db,
                        std::int64_t n, std::int64_t d);

}  // namespace corolla::cuda
