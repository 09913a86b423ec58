// kernels/cuda/elementwise.hpp — launchers of the elementwise kernels
// (host-only). All tensors of one call share the storage type `t`; math is
// f32. Every kernel reads an element's inputs before writing its outputs,
// so outputs may alias inputs of the same shape.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// out = silu(gate) * up.
void swiglu_forward(stream_t s, elem t, const void* gate, const void* up, void* out,
                    std::int64_t n);
/// dgate = dout * up * silu'(gate), dup = dout * silu(gate).
void swiglu_backward(stream_t s, elem t, const void* gate, const void* up, const void* dout,
                     void* dgate, void* dup, std::int64_t n);
/// y = tanh-GELU(x).
void gelu_forward(stream_t s, elem t, const void* x, void* y, std::int64_t n);
/// dx = dy * GELU'(x).
void gelu_backward(stream_t s, elem t, const void* x, const void* dy, void* dx, std::int64_t n);
/// out = a + b.
void add(stream_t s, elem t, const void* a, const void* b, void* out, std::int64_t n);
/// y *= alpha.
void scale(stream_t s, elem t, void* y, float alpha, std::int64_t n);

/// Blocks (and so doubles of scratch) sum_squares uses for n elements.
std::int64_t sum_squares_blocks(std::int64_t n);
/// *result (device) = sum x[i]^2 in f64: per-block partials in `partials`
/// (sum_squares_blocks(n) doubles), then one ordered sum. Deterministic.
void sum_squares(stream_t s, elem t, const void* x, std::int64_t n, double* partials,
                 double* result);

/// out[r, c] = bias[c] for rows x cols (the bias broadcast of linear).
void broadcast_rows(stream_t s, const void* bias, elem bias_t, void* out, elem out_t,
                    std::int64_t rows, std::int64_t cols);
/// acc[c] += sum over r of x[r, c] (db of linear), deterministic
/// (column_sums.hpp: chunks of rows, their partial sums added in order).
/// `partials`: column_partials_bytes(rows, cols, 1) of scratch (may be null
/// where that is 0).
void column_sum_accumulate(stream_t s, const void* x, elem x_t, std::int64_t rows,
                           std::int64_t cols, void* acc, elem acc_t, float* partials);

}  // namespace corolla::cuda
