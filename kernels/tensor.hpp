// kernels/tensor.hpp — the one tensor type of corolla.
//
// A Tensor is a typed, shaped, contiguous window onto shared storage. Views
// (reshape, slicing along the first dimension) share the storage and never
// copy. Storage is either owned (64-byte aligned, from the device allocator)
// or borrowed from something that outlives it (a memory-mapped checkpoint),
// in which case the storage keeps that owner alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace corolla {

/// Element types. `i8` is always paired with per-block f32 scales held in a
/// separate tensor (see quantize_int8 in backend.hpp).
enum class dtype : std::uint8_t { f32, bf16, f16, i32, i8 };

/// Size in bytes of one element of `t`.
std::size_t dtype_size(dtype t);
/// Lower-case name ("f32", "bf16", ...), as used in docs and error messages.
const char* dtype_name(dtype t);
/// Whether `t` holds floating-point values (f32, bf16, f16).
inline bool is_float_dtype(dtype t) { return t == dtype::f32 || t == dtype::bf16 || t == dtype::f16; }
/// The float dtype named "f32", "bf16" or "f16"; std::nullopt for any other
/// text (callers word their own error).
std::optional<dtype> float_dtype_named(const std::string& text);

enum class device_kind : std::uint8_t { cpu, cuda };

/// Where a tensor's bytes live.
struct device {
  device_kind kind = device_kind::cpu;
  int index = 0;
  friend bool operator==(const device&, const device&) = default;
  /// "cpu" or "cuda:N".
  std::string str() const;
};

/// Thrown for programming errors with tensors (shape or dtype mismatch).
/// Runtime code validates external input before it reaches tensors.
class tensor_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Memory operations of one device kind, registered by that kind's backend
/// (kernels/cuda/allocator.cpp for CUDA). storage and Tensor route every
/// access to non-host memory through them, never through host memcpy.
struct device_memory_ops {
  /// `bytes` of memory on device `index`, at least 64-byte aligned. Throws
  /// std::runtime_error (out of memory, no such device) on failure.
  void* (*allocate)(std::size_t bytes, int index) = nullptr;
  /// Gives back memory from `allocate`. Never throws.
  void (*release)(void* p, int index) noexcept = nullptr;
  /// Sets `bytes` bytes at `p` on device `index` to zero.
  void (*fill_zero)(void* p, std::size_t bytes, int index) = nullptr;
  /// Copies `bytes` bytes between any two of host and device memory; when
  /// `dst` is host memory it holds the bytes when the call returns.
  void (*copy)(void* dst, device dst_dev, const void* src, device src_dev,
               std::size_t bytes) = nullptr;
};

/// Installs the memory operations for `kind` (replacing earlier ones).
/// Thread-safe; normally called once by the backend's allocator.
void register_device_memory(device_kind kind, const device_memory_ops& ops);
/// The operations registered for `kind`; for CUDA in a CUDA build they are
/// installed on first use. Throws tensor_error when none exist (a build
/// without that backend).
const device_memory_ops& device_memory(device_kind kind);

/// A block of bytes. Owned storage frees itself (host memory) or goes back to
/// its device allocator; borrowed storage keeps `owner` alive instead.
class storage {
 public:
  /// Allocates `bytes` (64-byte aligned, uninitialised) on `dev`. Only the CPU
  /// allocator lives here; device memory comes from the device_memory_ops
  /// registered for dev.kind.
  static std::shared_ptr<storage> allocate(std::size_t bytes, device dev = {});
  /// Wraps memory owned by `owner` (which must keep `data` valid).
  static std::shared_ptr<storage> borrow(void* data, std::size_t bytes,
                                         std::shared_ptr<const void> owner, device dev = {});
  ~storage();
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  device dev() const { return dev_; }

 private:
  storage() = default;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  device dev_{};
  bool owned_ = false;
  std::shared_ptr<const void> owner_;
};

using shape_t = std::vector<std::int64_t>;
/// "[2, 3, 4]"
std::string shape_str(const shape_t& s);
/// Product of the dimensions (1 for a scalar shape []).
std::int64_t shape_numel(const shape_t& s);

/// A contiguous, row-major tensor view.
class Tensor {
 public:
  Tensor() = default;

  /// Uninitialised tensor on `dev`.
  static Tensor empty(shape_t shape, dtype t = dtype::f32, device dev = {});
  /// Zero-filled host tensor.
  static Tensor zeros(shape_t shape, dtype t = dtype::f32);
  /// CPU f32 tensor holding a copy of `values` with the given shape.
  static Tensor from_f32(std::span<const float> values, shape_t shape);
  /// CPU i32 tensor holding a copy of `values` with the given shape.
  static Tensor from_i32(std::span<const std::int32_t> values, shape_t shape);
  /// A tensor over existing storage starting `offset` bytes in.
  static Tensor wrap(std::shared_ptr<storage> s, std::size_t offset, shape_t shape, dtype t);

  bool defined() const { return storage_ != nullptr; }
  const shape_t& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension `i`; negative `i` counts from the end.
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(type_); }
  dtype type() const { return type_; }
  device dev() const { return storage_ ? storage_->dev() : device{}; }
  const std::shared_ptr<storage>& storage_ptr() const { return storage_; }
  std::size_t offset() const { return offset_; }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  /// Typed pointer; throws tensor_error if T does not match the dtype.
  template <class T> T* data() const;

  /// Same storage, new shape with the same number of elements. One dimension
  /// may be -1 (inferred).
  Tensor view(shape_t shape) const;
  /// Rows [begin, end) along the first dimension, sharing storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  /// The same view, assigned to `out`: reuses out's shape storage, so a
  /// hot path that keeps `out` allocates nothing once it held a tensor of
  /// this rank.
  void slice_into(std::int64_t begin, std::int64_t end, Tensor& out) const;
  /// Deep copy (same dtype and device; device memory through its
  /// device_memory_ops).
  Tensor clone() const;
  /// Copy converted to `t` (host tensors only: f32 <-> bf16/f16 and
  /// identity); device tensors convert with Backend::copy.
  Tensor to(dtype t) const;
  /// Copies the values of `src` (same numel, same dtype) into this tensor;
  /// either may be on a device (then through its device_memory_ops; device
  /// ranges must not overlap).
  void copy_from(const Tensor& src);
  /// Sets every byte to zero (host or device).
  void zero();

  /// Element values as f32 (converting bf16/f16/i32); a device tensor is
  /// first copied to the host. For tests and small host-side work, never hot
  /// paths.
  std::vector<float> to_vector() const;

 private:
  std::shared_ptr<storage> storage_;
  std::size_t offset_ = 0;
  shape_t shape_;
  std::int64_t numel_ = 0;
  dtype type_ = dtype::f32;
};

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int8_t> { static constexpr dtype value = dtype::i8; };

template <class T> T* Tensor::data() const {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    if (type_ != dtype::bf16 && type_ != dtype::f16)
      throw tensor_error(std::string("tensor is ") + dtype_name(type_) + ", not a 16-bit float");
  } else if constexpr (std::is_same_v<T, std::byte> || std::is_same_v<T, char>) {
    // raw bytes of any dtype
  } else {
    if (type_ != dtype_of<std::remove_const_t<T>>::value)
      throw tensor_error(std::string("tensor is ") + dtype_name(type_) + ", accessed as " +
                         dtype_name(dtype_of<std::remove_const_t<T>>::value));
  }
  return static_cast<T*>(raw());
}

/// Throws tensor_error naming `what` unless `t` has exactly `shape`.
void expect_shape(const Tensor& t, const shape_t& shape, const char* what);
/// Throws tensor_error naming `what` unless `t` has dtype `type`.
void expect_dtype(const Tensor& t, dtype type, const char* what);

}  // namespace corolla
