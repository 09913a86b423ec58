#include "model/params.hpp"

#include "kernels/backend.hpp"

namespace corolla {

namespace {

/// Each tensor of `layout` at its offset, every one on a 16-element
/// boundary; returns the whole size.
std::int64_t lay_out(const std::vector<std::pair<std::string, shape_t>>& layout, std::vector<param_entry>& entries) {
  std::int64_t offset = 0;
  for (const auto& [name, shape] : layout) {
    param_entry e{name, shape, offset, shape_numel(shape)};
    offset += (e.numel + 15) / 16 * 16;
    entries.push_back(std::move(e));
  }
  return offset;
}

}  // namespace

param_set::param_set(const std::vector<std::pair<std::string, shape_t>>& layout) {
  flat_ = Tensor::zeros({lay_out(layout, entries_)});
}

param_set::param_set(const std::vector<std::pair<std::string, shape_t>>& layout, Tensor flat) {
  const std::int64_t size = lay_out(layout, entries_);
  if (!flat.defined() || flat.type() != dtype::f32 || flat.shape().size() != 1 || flat.numel() != size)
    throw tensor_error("a parameter set of " + std::to_string(size) + " f32 values cannot sit over a buffer of " +
                       (flat.defined() ? std::to_string(flat.numel()) + " " + dtype_name(flat.type()) + " values in " +
                                             std::to_string(flat.shape().size()) + " dimension(s)"
                                       : std::string("nothing")));
  flat_ = std::move(flat);
}

std::int64_t param_set::size_of(const std::vector<std::pair<std::string, shape_t>>& layout) {
  std::vector<param_entry> entries;
  return lay_out(layout, entries);
}

param_set param_set::like() const {
  param_set r;
  r.entries_ = entries_;
  if (flat_.defined() && flat_.dev().kind != device_kind::cpu) {
    // Gradients and moments live with the parameters (zeroed through the
    // device's memory hooks).
    r.flat_ = Tensor::empty({size()}, dtype::f32, flat_.dev());
    r.flat_.zero();
  } else {
    r.flat_ = Tensor::zeros({size()});
  }
  return r;
}

bool param_set::has(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return true;
  return false;
}

Tensor param_set::get(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return flat_.slice(e.offset, e.offset + e.numel).view(e.shape);
  throw tensor_error("no parameter named '" + name + "'");
}

void place_params(param_set& set, Backend& be) {
  if (be.dev().kind == device_kind::cpu || !set.flat().defined() || set.flat().dev() == be.dev()) return;
  Tensor on_device = be.empty({set.size()});
  be.copy(set.flat(), on_device);
  set.flat() = std::move(on_device);  // the host copy goes when its last view does
}

}  // namespace corolla
