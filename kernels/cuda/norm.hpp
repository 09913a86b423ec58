// kernels/cuda/norm.hpp — RMSNorm and LayerNorm launchers (host-only;
// device pointers, [n, d] row-major). Activations (x, y, a, b, sum, dy, dx)
// are of element type `t`; weights, statistics (rstd, mean) and parameter
// gradients (dw, db) are f32.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// y = x * rstd * w per row; rstd[r] saved when rstd is not null.
void rmsnorm_forward(stream_t s, elem t, const void* x, const float* w, float eps, void* y, float* rstd,
                     std::int64_t n, std::int64_t d);
/// sum = a + b and y = rmsnorm(sum) for [n, d] rows (no rstd).
void add_rmsnorm(stream_t s, elem t, const void* a, const void* b, void* sum, const float* w, float eps, void* y,
                 std::int64_t n, std::int64_t d);
/// dx overwritten (plus dres, the residual's gradient of dx's type, when
/// not null: one rounding), dw accumulated. `partials`: scratch of
/// column_partials_bytes(n, d, 1) (column_sums.hpp; may be null where 0).
void rmsnorm_backward(stream_t s, elem t, const void* x, const float* w, const float* rstd, const void* dy,
                      void* dx, float* dw, std::int64_t n, std::int64_t d, float* partials,
                      const void* dres = nullptr);
/// y = (x - mean) * rstd * w + b per row; mean/rstd saved when not null.
void layernorm_forward(stream_t s, elem t, const void* x, const float* w, const float* b, float eps, void* y,
                       float* mean, float* rstd, std::int64_t n, std::int64_t d);
/// dx overwritten (plus dres when not null, as rmsnorm_backward), dw and
/// db accumulated. `partials`: column_partials_bytes(n, d, 2) of scratch.
void layernorm_backward(stream_t s, elem t, const void* x, const float* w, const float* mean, const float* rstd,
                        const void* dy, void* dx, float* dw, float* db, std::int64_t n, std::int64_t d,
                        float* partials, const void* dres = nullptr);

}  // namespace corolla::cuda
