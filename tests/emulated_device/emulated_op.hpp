// tests/emulated_device/emulated_op.hpp — what each of the emulated
// device backend's ops does first (emulated_device.cpp,
// emulated_products.cpp, emulated_ops.cpp): holds the backend as its one
// user (user), takes the CUDA backend's dtype rules (want, want_float), and
// its operands as host views with 16-bit ones widened (operands).
#pragma once

#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emulated_device.hpp"

namespace corolla::testing {

/// Held for the length of an op: a second thread entering meanwhile throws.
class emulated_device_backend::user {
 public:
  explicit user(emulated_device_backend& b) : b_(b) {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id none{};
    if (!b_.owner_.compare_exchange_strong(none, me) && none != me)
      throw std::logic_error("two threads used " + b_.name() + " at once (a device backend's queue belongs to one "
                             "thread; another thread needs its companion())");
    ++b_.depth_;
    ++b_.stats_.ops;
  }
  ~user() {
    if (--b_.depth_ == 0) b_.owner_.store(std::thread::id{});
  }
  user(const user&) = delete;
  user& operator=(const user&) = delete;

 private:
  emulated_device_backend& b_;
};

// ---- dtype rules --------------------------------------------------------------
// The CUDA backend's (kernels/cuda/cuda_ops.cpp, gemm.cpp), so a plan that
// hands an op a dtype CUDA refuses fails here too.
namespace emulated {

/// `t` (when defined) has dtype `type`.
inline void want(const Tensor& t, dtype type, const char* what) {
  if (t.defined() && t.type() != type)
    throw tensor_error(std::string(what) + ": expected " + dtype_name(type) + ", got " + dtype_name(t.type()));
}
inline void want(const Tensor* t, dtype type, const char* what) {
  if (t != nullptr) want(*t, type, what);
}
/// `t` (when defined) is f32, bf16 or f16.
inline void want_float(const Tensor& t, const char* what) {
  if (t.defined() && !is_float_dtype(t.type()))
    throw tensor_error(std::string(what) + ": expected a float tensor, got " + dtype_name(t.type()));
}

}  // namespace emulated

/// One op's operands as the CPU backend takes them: host views of this
/// device's memory, where 16-bit tensors are widened into f32 copies (the
/// CUDA kernels compute in f32 on the widened values) and the outputs among
/// them are rounded back once by finish() (the kernels' one rounding on
/// store). An output is widened with its current values, so ops that
/// accumulate into it or work in place see them.
class emulated_device_backend::operands {
 public:
  explicit operands(const emulated_device_backend& b) : b_(b) {}
  /// An input (read only); undefined stays undefined.
  Tensor in(const Tensor& t, const char* what) const { return widened(b_.on_device(t, what)); }
  /// An output (read too when the op accumulates or works in place).
  Tensor out(const Tensor& t, const char* what) {
    Tensor view = b_.on_device(t, what);
    Tensor wide = widened(view);
    if (wide.defined() && wide.type() != view.type()) written_.emplace_back(wide, view);
    return wide;
  }
  /// An optional output: null stays null, else `slot` holds its view.
  Tensor* out(Tensor* t, const char* what, Tensor& slot) {
    if (t == nullptr) return nullptr;
    slot = out(*t, what);
    return &slot;
  }
  /// An index tensor: the host, or this device (never widened).
  Tensor index(const Tensor& t, const char* what) const { return b_.index_tensor(t, what); }
  /// Rounds the widened outputs into their 16-bit storage.
  void finish() {
    for (auto& [wide, view] : written_) view.copy_from(wide.to(view.type()));
  }

 private:
  static Tensor widened(const Tensor& v) {
    return v.defined() && (v.type() == dtype::bf16 || v.type() == dtype::f16) ? v.to(dtype::f32) : v;
  }
  const emulated_device_backend& b_;
  std::vector<std::pair<Tensor, Tensor>> written_;  ///< (f32 copy, 16-bit view)
};

}  // namespace corolla::testing
