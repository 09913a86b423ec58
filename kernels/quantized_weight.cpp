// kernels/quantized_weight.cpp — quantize_rows, dequantize_rows and
// linear_as (quantized_weight.hpp) on any backend.
#include "kernels/quantized_weight.hpp"

#include <string>

#include "kernels/backend.hpp"
#include "kernels/nf4.hpp"

namespace corolla {

quantized_weight quantize_rows(Backend& be, const Tensor& w, weight_format f) {
  if (!w.defined() || w.rank() != 2) throw tensor_error("quantize_rows: expected a 2-D [out, in] weight");
  const std::int64_t rows = w.dim(0), cols = w.dim(1);
  if (f == weight_format::nf4) {
    quantized_weight r{be.empty({rows, nf4_row_bytes(cols)}, dtype::i8), be.empty({rows, nf4_row_blocks(cols)})};
    be.quantize_nf4(w, r.q, r.scale);
    return r;
  }
  if (f != weight_format::int8)
    throw tensor_error(std::string("quantize_rows: ") + weight_format_name(f) + " is not a quantised format");
  quantized_weight r{be.empty({rows, cols}, dtype::i8), be.empty({rows})};
  Tensor flat_q = r.q.view({rows * cols});
  be.quantize_int8(w.view({rows * cols}), static_cast<int>(cols), flat_q, r.scale);
  return r;
}

void dequantize_rows(Backend& be, weight_format f, const Tensor& q, const Tensor& scale, Tensor& w) {
  if (!w.defined() || w.rank() != 2) throw tensor_error("dequantize_rows: expected a 2-D [out, in] f32 weight");
  const std::int64_t rows = w.dim(0), cols = w.dim(1);
  switch (f) {
    case weight_format::nf4: be.dequantize_nf4(q, scale, w); return;
    case weight_format::int8: {
      Tensor flat = w.view({rows * cols});
      be.dequantize_int8(q.view({rows * cols}), scale.view({rows}), static_cast<int>(cols), flat);
      return;
    }
    case weight_format::f32:
    case weight_format::bf16: be.copy(q, w); return;
  }
}

void linear_as(Backend& be, weight_format f, const Tensor& x, const Tensor& w, const Tensor& scale,
               const Tensor* bias, Tensor& y) {
  switch (f) {
    case weight_format::int8: be.linear_q8(x, w, scale, bias, y); return;
    case weight_format::nf4: be.linear_nf4(x, w, scale, bias, y); return;
    case weight_format::f32:
    case weight_format::bf16: be.linear(x, w, bias, y); return;
  }
}

}  // namespace corolla
