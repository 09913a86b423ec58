#include "kernels/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kernels/half.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/allocator.hpp"
#endif

namespace corolla {

std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::bf16: return 2;
    case dtype::f16: return 2;
    case dtype::i32: return 4;
    case dtype::i8: return 1;
  }
  return 0;
}

const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::i32: return "i32";
    case dtype::i8: return "i8";
  }
  return "?";
}

std::optional<dtype> float_dtype_named(const std::string& text) {
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16})
    if (text == dtype_name(t)) return t;
  return std::nullopt;
}

std::string device::str() const {
  return kind == device_kind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

namespace {

/// Registered operations per device kind; published once, never freed (a
/// storage may be destroyed during static destruction and still needs them).
std::atomic<const device_memory_ops*> g_device_ops[2] = {nullptr, nullptr};

}  // namespace

void register_device_memory(device_kind kind, const device_memory_ops& ops) {
  if (kind == device_kind::cpu) throw tensor_error("register_device_memory: cpu memory is built in");
  g_device_ops[static_cast<int>(kind)].store(new device_memory_ops(ops));
}

const device_memory_ops& device_memory(device_kind kind) {
  const device_memory_ops* ops = g_device_ops[static_cast<int>(kind)].load();
#ifdef COROLLA_HAVE_CUDA
  if (!ops && kind == device_kind::cuda) {
    cuda::install_memory_ops();
    ops = g_device_ops[static_cast<int>(kind)].load();
  }
#endif
  if (!ops)
    throw tensor_error(std::string("no memory allocator is registered for ") +
                       (kind == device_kind::cuda ? "cuda" : "cpu") +
                       " devices (this binary was built without that backend)");
  return *ops;
}

std::shared_ptr<storage> storage::allocate(std::size_t bytes, device dev) {
  if (dev.kind != device_kind::cpu) {
    const device_memory_ops& ops = device_memory(dev.kind);
    auto s = std::shared_ptr<storage>(new storage());
    s->data_ = ops.allocate(bytes, dev.index);
    s->bytes_ = bytes;
    s->dev_ = dev;
    s->owned_ = true;
    return s;
  }
  auto s = std::shared_ptr<storage>(new storage());
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
  s->data_ = std::aligned_alloc(64, rounded);
  if (!s->data_) throw std::bad_alloc();
  s->bytes_ = bytes;
  s->dev_ = dev;
  s->owned_ = true;
  return s;
}

std::shared_ptr<storage> storage::borrow(void* data, std::size_t bytes,
                                         std::shared_ptr<const void> owner, device dev) {
  auto s = std::shared_ptr<storage>(new storage());
  s->data_ = data;
  s->bytes_ = bytes;
  s->dev_ = dev;
  s->owner_ = std::move(owner);
  return s;
}

storage::~storage() {
  if (!owned_) return;
  if (dev_.kind == device_kind::cpu) {
    std::free(data_);
  } else if (const device_memory_ops* ops = g_device_ops[static_cast<int>(dev_.kind)].load()) {
    ops->release(data_, dev_.index);  // registered: allocate() went through it
  }
}

std::string shape_str(const shape_t& s) {
  std::ostringstream o;
  o << '[';
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

std::int64_t shape_numel(const shape_t& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw tensor_error("negative dimension in shape " + shape_str(s));
    n *= d;
  }
  return n;
}

Tensor Tensor::wrap(std::shared_ptr<storage> s, std::size_t offset, shape_t shape, dtype t) {
  Tensor r;
  r.numel_ = shape_numel(shape);
  if (offset + static_cast<std::size_t>(r.numel_) * dtype_size(t) > s->bytes())
    throw tensor_error("tensor of shape " + shape_str(shape) + " does not fit its storage");
  r.storage_ = std::move(s);
  r.offset_ = offset;
  r.shape_ = std::move(shape);
  r.type_ = t;
  return r;
}

Tensor Tensor::empty(shape_t shape, dtype t, device dev) {
  std::int64_t n = shape_numel(shape);
  return wrap(storage::allocate(static_cast<std::size_t>(n) * dtype_size(t), dev), 0,
              std::move(shape), t);
}

Tensor Tensor::zeros(shape_t shape, dtype t) {
  Tensor r = empty(std::move(shape), t);
  r.zero();
  return r;
}

Tensor Tensor::from_f32(std::span<const float> values, shape_t shape) {
  Tensor r = empty(std::move(shape), dtype::f32);
  if (static_cast<std::size_t>(r.numel()) != values.size())
    throw tensor_error("from_f32: " + std::to_string(values.size()) + " values for shape " +
                       shape_str(r.shape()));
  std::memcpy(r.raw(), values.data(), r.nbytes());
  return r;
}

Tensor Tensor::from_i32(std::span<const std::int32_t> values, shape_t shape) {
  Tensor r = empty(std::move(shape), dtype::i32);
  if (static_cast<std::size_t>(r.numel()) != values.size())
    throw tensor_error("from_i32: " + std::to_string(values.size()) + " values for shape " +
                       shape_str(r.shape()));
  std::memcpy(r.raw(), values.data(), r.nbytes());
  return r;
}

std::int64_t Tensor::dim(int i) const {
  int r = rank();
  if (i < 0) i += r;
  if (i < 0 || i >= r)
    throw tensor_error("dimension " + std::to_string(i) + " of a tensor of shape " +
                       shape_str(shape_));
  return shape_[static_cast<std::size_t>(i)];
}

Tensor Tensor::view(shape_t shape) const {
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw tensor_error("view: more than one -1 in " + shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel_ % known != 0)
      throw tensor_error("view: cannot infer " + shape_str(shape) + " from " + shape_str(shape_));
    shape[static_cast<std::size_t>(infer)] = numel_ / known;
  }
  if (shape_numel(shape) != numel_)
    throw tensor_error("view: " + shape_str(shape_) + " cannot be viewed as " + shape_str(shape));
  Tensor r = *this;
  r.shape_ = std::move(shape);
  return r;
}

void Tensor::slice_into(std::int64_t begin, std::int64_t end, Tensor& out) const {
  if (rank() == 0) throw tensor_error("slice of a scalar");
  if (begin < 0 || end < begin || end > shape_[0])
    throw tensor_error("slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of shape " +
                       shape_str(shape_));
  const std::int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  out = *this;  // copy-assignment: the shape vector keeps its capacity
  out.shape_[0] = end - begin;
  out.numel_ = row * (end - begin);
  out.offset_ = offset_ + static_cast<std::size_t>(begin * row) * dtype_size(type_);
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  Tensor r;
  slice_into(begin, end, r);
  return r;
}

Tensor Tensor::clone() const {
  if (!defined()) return {};  // raw() needs storage
  Tensor r = empty(shape_, type_, dev());
  r.copy_from(*this);
  return r;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.numel() != numel_ || src.type() != type_)
    throw tensor_error("copy_from: " + shape_str(src.shape()) + " " + dtype_name(src.type()) +
                       " into " + shape_str(shape_) + " " + dtype_name(type_));
  if (!defined() || !src.defined()) {
    if (numel_ == 0) return;
    throw tensor_error("copy_from: tensor is undefined");
  }
  if (dev().kind == device_kind::cpu && src.dev().kind == device_kind::cpu) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  if (nbytes() == 0) return;
  const device_kind kind = dev().kind != device_kind::cpu ? dev().kind : src.dev().kind;
  device_memory(kind).copy(raw(), dev(), src.raw(), src.dev(), nbytes());
}

void Tensor::zero() {
  if (!defined()) return;  // nothing to zero; raw() needs storage
  if (dev().kind != device_kind::cpu) {
    if (nbytes() > 0) device_memory(dev().kind).fill_zero(raw(), nbytes(), dev().index);
    return;
  }
  std::memset(raw(), 0, nbytes());
}

Tensor Tensor::to(dtype t) const {
  if (dev().kind != device_kind::cpu)
    throw tensor_error("to: host tensors only (this one is on " + dev().str() +
                       "); convert device tensors with Backend::copy");
  if (t == type_) return clone();
  Tensor r = empty(shape_, t);
  auto n = static_cast<std::size_t>(numel_);
  const auto* u16 = static_cast<const std::uint16_t*>(raw());
  if (t == dtype::f32 && type_ == dtype::bf16) {
    bf16_to_f32(u16, r.data<float>(), n);
  } else if (t == dtype::f32 && type_ == dtype::f16) {
    f16_to_f32(u16, r.data<float>(), n);
  } else if (t == dtype::bf16 && type_ == dtype::f32) {
    f32_to_bf16(data<float>(), r.data<std::uint16_t>(), n);
  } else if (t == dtype::f16 && type_ == dtype::f32) {
    f32_to_f16(data<float>(), r.data<std::uint16_t>(), n);
  } else if (t == dtype::f32 && type_ == dtype::i32) {
    const auto* s = data<std::int32_t>();
    auto* d = r.data<float>();
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
  } else if (t == dtype::f32 && type_ == dtype::i8) {
    const auto* s = data<std::int8_t>();
    auto* d = r.data<float>();
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
  } else if ((t == dtype::bf16 || t == dtype::f16) && type_ != dtype::f32) {
    return to(dtype::f32).to(t);  // bf16 <-> f16, i32/i8 -> 16-bit float, through f32
  } else {
    // Reaching f32 -> i32/i8 would recurse forever through to(f32); integer
    // targets are not conversions this method offers.
    throw tensor_error(std::string("to: cannot convert ") + dtype_name(type_) + " to " +
                       dtype_name(t));
  }
  return r;
}

std::vector<float> Tensor::to_vector() const {
  if (defined() && dev().kind != device_kind::cpu) {
    Tensor host = empty(shape_, type_);
    host.copy_from(*this);
    return host.to_vector();
  }
  if (type_ == dtype::f32) {
    const float* p = data<float>();
    return {p, p + numel_};
  }
  Tensor f = to(dtype::f32);
  const float* p = f.data<float>();
  return {p, p + numel_};
}

void expect_shape(const Tensor& t, const shape_t& shape, const char* what) {
  if (t.shape() != shape)
    throw tensor_error(std::string(what) + ": expected shape " + shape_str(shape) + ", got " +
                       shape_str(t.shape()));
}

void expect_dtype(const Tensor& t, dtype type, const char* what) {
  if (t.type() != type)
    throw tensor_error(std::string(what) + ": expected " + dtype_name(type) + ", got " +
                       dtype_name(t.type()));
}

}  // namespace corolla
