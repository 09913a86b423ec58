// model/block_compute.cpp — a block's 16-bit compute weights for mixed
// precision training (stage::set_compute_dtype; declared in
// model/block.hpp): tensors of their own (compute_weights_like, filled by
// copy_linear_weights), or views of one flat copy of the block's parameter
// buffer (compute_weights_in), which one conversion, or AdamW's own pass
// (Backend::adamw_with_copy), fills at once.
#include <cstddef>
#include <string>

#include "model/block.hpp"

namespace corolla {

namespace {
/// The linear weights and biases of a block (the roles mixed precision
/// converts; a bias of the output's dtype fuses into the product). Of a
/// mixture-of-experts block, its experts' weights too (expert_linear_roles);
/// the router and the shared expert's gate stay f32 (model/moe.hpp).
constexpr Tensor block_tensors::*linear_roles[] = {
    &block_tensors::q_w, &block_tensors::k_w,    &block_tensors::v_w,  &block_tensors::o_w,
    &block_tensors::gate_w, &block_tensors::up_w, &block_tensors::down_w, &block_tensors::q_b,
    &block_tensors::k_b, &block_tensors::v_b,    &block_tensors::o_b,  &block_tensors::up_b,
    &block_tensors::down_b};
constexpr Tensor expert_tensors::*expert_linear_roles[] = {&expert_tensors::gate_w, &expert_tensors::up_w,
                                                           &expert_tensors::down_w};

/// Where `t` starts in `flat` (f32), in elements; throws tensor_error
/// naming `role` unless t lies wholly inside it.
std::int64_t offset_in(const Tensor& t, const Tensor& flat, const char* role) {
  const auto* lo = static_cast<const unsigned char*>(flat.raw());
  const auto* at = static_cast<const unsigned char*>(t.raw());
  const std::ptrdiff_t bytes = at - lo;
  if (t.type() != dtype::f32 || bytes < 0 || bytes % 4 != 0 ||
      bytes / 4 + t.numel() > static_cast<std::ptrdiff_t>(flat.numel()))
    throw tensor_error(std::string("compute_weights_in: the ") + role +
                       " weight is not an f32 view of the block's parameter buffer");
  return bytes / 4;
}

/// `copy`'s slice at the place of w's role in flat, shaped as it.
Tensor view_at_role(const Tensor& w, const Tensor& flat, const Tensor& copy, const char* role) {
  const std::int64_t at = offset_in(w, flat, role);
  return copy.slice(at, at + w.numel()).view(w.shape());
}

}  // namespace

block_tensors compute_weights_in(const block_tensors& w, const param_set& p, const Tensor& copy) {
  const Tensor& flat = p.flat();
  if (copy.type() != dtype::bf16 && copy.type() != dtype::f16)
    throw tensor_error(std::string("compute weights are bf16 or f16, not ") + dtype_name(copy.type()));
  if (copy.rank() != 1 || copy.numel() != p.size() || copy.dev() != flat.dev())
    throw tensor_error("compute_weights_in: the copy is a flat tensor of the parameters' " + std::to_string(p.size()) +
                       " elements on " + flat.dev().str() + ", got " + shape_str(copy.shape()) + " on " +
                       copy.dev().str());
  block_tensors out = w;
  for (Tensor block_tensors::*role : linear_roles)
    if ((w.*role).defined()) out.*role = view_at_role(w.*role, flat, copy, "linear");
  for (expert_tensors& e : out.experts)
    for (Tensor expert_tensors::*role : expert_linear_roles)
      if ((e.*role).defined()) e.*role = view_at_role(e.*role, flat, copy, "expert");
  out.qkv_w = out.qkv_b = out.gate_up_w = Tensor{};
  return out;
}

block_tensors compute_weights_like(Backend& be, const block_tensors& w, dtype t) {
  if (t != dtype::bf16 && t != dtype::f16)
    throw tensor_error(std::string("compute weights are bf16 or f16, not ") + dtype_name(t));
  block_tensors out = w;
  for (Tensor block_tensors::*role : linear_roles)
    if ((w.*role).defined()) out.*role = be.empty((w.*role).shape(), t);
  for (expert_tensors& e : out.experts)
    for (Tensor expert_tensors::*role : expert_linear_roles)
      if ((e.*role).defined()) e.*role = be.empty((e.*role).shape(), t);
  out.qkv_w = out.qkv_b = out.gate_up_w = Tensor{};
  return out;
}

void copy_linear_weights(Backend& be, const block_tensors& from, block_tensors& to) {
  for (Tensor block_tensors::*role : linear_roles)
    if ((from.*role).defined()) be.copy(from.*role, to.*role);
  if (from.experts.size() != to.experts.size())
    throw tensor_error("copy_linear_weights: " + std::to_string(from.experts.size()) + " experts into " +
                       std::to_string(to.experts.size()));
  for (std::size_t e = 0; e < from.experts.size(); ++e)
    for (Tensor expert_tensors::*role : expert_linear_roles)
      if ((from.experts[e].*role).defined()) be.copy(from.experts[e].*role, to.experts[e].*role);
}

}  // namespace corolla
