// kernels/quantized_weight.hpp — an inference weight of any format
// (kernels/weight_format.hpp) as the Backend's ops take it: quantised into
// rows, widened back, and multiplied through the product its format needs.
#pragma once

#include "kernels/tensor.hpp"
#include "kernels/weight_format.hpp"

namespace corolla {

class Backend;

/// A quantised inference weight: int8 (Backend::linear_q8: q i8 [out, in],
/// scale f32 [out], one per output channel) or NF4 (Backend::linear_nf4:
/// q i8 [out, nf4_row_bytes(in)] of packed codes, scale f32
/// [out, nf4_row_blocks(in)] the blocks' absmax). Rows are independent in
/// both, so row slices of q and scale are weights of their own.
struct quantized_weight {
  Tensor q, scale;
};
/// `w` (f32 [out, in], on be's device) quantised as `f` (int8: per output
/// channel, Backend::quantize_int8 with one block per row; nf4:
/// Backend::quantize_nf4). Throws tensor_error for another format.
quantized_weight quantize_rows(Backend& be, const Tensor& w, weight_format f = weight_format::int8);
/// The inverse, for any format: w (f32 [out, in], on be's device) = the
/// weight `q` of format `f` with its scales (undefined for f32 and bf16)
/// widened: dequantised (int8, nf4) or converted (bf16), or copied (f32).
void dequantize_rows(Backend& be, weight_format f, const Tensor& q, const Tensor& scale, Tensor& w);
/// y = x @ w^T (+ bias) for a weight of format `f` with its scales (the
/// undefined tensor for f32 and bf16): linear_q8, linear_nf4 or linear.
void linear_as(Backend& be, weight_format f, const Tensor& x, const Tensor& w, const Tensor& scale,
               const Tensor* bias, Tensor& y);

}  // namespace corolla
