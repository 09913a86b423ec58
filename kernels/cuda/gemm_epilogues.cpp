// kernels/cuda/gemm_epilogues.cpp — training's products with the op after
// them in cuBLASLt's epilogue (Backend::linear_fused's add for many rows,
// linear_gelu, gemm_gelu_backward), so the op's own pass over the
// activations goes away:
//  * the residual add after the attention output and MLP down projections
//    (prefill's too, with f32 weights and more than 16 rows): the residual
//    is the product's C with beta 1 and y its D (bias in the BIAS
//    epilogue), y = x @ w^T + bias + residual rounded once (a 16-bit y
//    takes no split-K algorithm that reduces in 16 bits: lt_extra);
//  * GPT-2's up projection and GELU: GELU_AUX(_BIAS) writes gelu(pre) to y
//    and pre, the GELU's input that its backward needs, to the aux matrix;
//  * the GELU's backward into the down projection's input gradient: DGELU
//    multiplies dy @ w_down by GELU's derivative at pre (the aux matrix,
//    read) before rounding.
// cuBLASLt's GELU is the tanh form, as Backend::gelu. Each op declines
// (returns false, nothing done) where the heuristic has no algorithm, and
// COROLLA_CUDA_LT_EPILOGUES=0 declines them all (the model's two ops run:
// for measuring the fusion, or ruling it out).
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {
namespace {

bool lt_epilogues_enabled() {
  static const bool enabled = env_switch("COROLLA_CUDA_LT_EPILOGUES", true);
  return enabled;
}

}  // namespace

bool cuda_backend::linear_add_lt(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual,
                                 Tensor& y) {
  if (!lt_epilogues_enabled() || !check_linear_add_product(x, w, bias, residual, y, dev())) return false;
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  device_guard guard(index_);
  lt_extra extra = bias_epilogue(bias ? bias->raw() : nullptr);
  extra.d = y.raw();  // c, the residual, is only read (it may be y itself)
  extra.may_decline = true;
  return lt_matmul(false, true, rows, out, in, 1.0f, x.raw(), x.type(), in, w.raw(), w.type(), in, 1.0f,
                   const_cast<void*>(residual.raw()), y.type(), out, extra);
}

bool cuda_backend::linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& pre, Tensor& y) {
  if (!lt_epilogues_enabled() || !check_linear_gelu(x, w, bias, pre, y, dev())) return false;
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  device_guard guard(index_);
  lt_extra extra;
  extra.epilogue = bias ? lt_epilogue::gelu_aux_bias : lt_epilogue::gelu_aux;
  extra.bias = bias ? bias->raw() : nullptr;
  extra.aux = pre.raw();  // written: the GELU's input, laid out as y
  extra.aux_ld = out;
  extra.may_decline = true;
  return lt_matmul(false, true, rows, out, in, 1.0f, x.raw(), x.type(), in, w.raw(), w.type(), in, 0.0f, y.raw(),
                   y.type(), out, extra);
}

bool cuda_backend::gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) {
  if (!lt_epilogues_enabled() || !check_gemm_gelu_backward(dy, w, pre, dpre, dev())) return false;
  const std::int64_t rows = dy.dim(0), out = dy.dim(1), in = w.dim(1);
  device_guard guard(index_);
  lt_extra extra;
  extra.epilogue = lt_epilogue::dgelu;
  extra.aux = const_cast<void*>(pre.raw());  // read: the GELU's input
  extra.aux_ld = in;
  extra.may_decline = true;
  // dpre[rows, in] = (dy[rows, out] @ w[out, in]) * gelu'(pre)
  return lt_matmul(false, false, rows, in, out, 1.0f, dy.raw(), dy.type(), out, w.raw(), w.type(), in, 0.0f,
                   dpre.raw(), dpre.type(), in, extra);
}

}  // namespace corolla::cuda
