// model/workspace.hpp — preallocated row buffers for the inference hot path.
//
// Generation runs the same small shapes (one row per decode step) thousands
// of times. A row_buffer owns one [capacity, width] tensor and hands out a
// view of its first n rows; it allocates only when n exceeds the capacity and
// caches the last view, so asking again for the same n allocates nothing —
// not even the small shape vector a new Tensor view would carry.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "kernels/backend.hpp"

namespace corolla {

/// A growable [capacity, width] device buffer handing out row views.
/// Not thread-safe; the returned reference stays valid until the next call.
class row_buffer {
 public:
  row_buffer() = default;
  /// Rows of `width` elements of `type`; width 0 means one element per row
  /// and views of shape [n] (per-row scalars, ids, positions).
  explicit row_buffer(std::int64_t width, dtype type = dtype::f32) : width_(width), type_(type) {}

  /// Makes room for `rows` rows without changing the current view's rows.
  void reserve(Backend& be, std::int64_t rows) {
    if (rows <= capacity_) return;
    full_ = width_ > 0 ? be.empty({rows, width_}, type_) : be.empty({rows}, type_);
    capacity_ = rows;
    view_rows_ = -1;
  }

  /// A view of the first `n` rows, valid until the next call on this buffer.
  Tensor& rows(Backend& be, std::int64_t n) {
    if (n != view_rows_) {
      reserve(be, n);
      view_ = full_.slice(0, n);
      view_rows_ = n;
    }
    return view_;
  }

  std::int64_t capacity() const { return capacity_; }
  std::int64_t width() const { return width_; }

 private:
  std::int64_t width_ = 0;
  dtype type_ = dtype::f32;
  std::int64_t capacity_ = 0;
  std::int64_t view_rows_ = -1;
  Tensor full_;
  Tensor view_;
};

/// Makes `t` a tensor of exactly `shape` on `be`, reusing its storage when
/// the shape already matches (training buffers kept across steps).
inline Tensor& ensure_tensor(Backend& be, Tensor& t, const shape_t& shape, dtype type = dtype::f32) {
  if (!t.defined() || t.shape() != shape || t.type() != type) t = be.empty(shape, type);
  return t;
}

/// Whether `t` is [rows, width], without building a shape vector.
inline bool has_rows(const Tensor& t, std::int64_t rows, std::int64_t width) {
  const shape_t& s = t.shape();
  return s.size() == 2 && s[0] == rows && s[1] == width;
}

/// ensure_tensor for [rows, width] on hot paths: builds a shape vector only
/// when it allocates.
inline Tensor& ensure_rows(Backend& be, Tensor& t, std::int64_t rows, std::int64_t width, dtype type = dtype::f32) {
  if (t.defined() && t.type() == type && has_rows(t, rows, width)) return t;
  return ensure_tensor(be, t, {rows, width}, type);
}

/// Throws tensor_error naming `what` unless `t` is [rows, width]. Unlike
/// expect_shape it builds no shape vector unless it fails (hot paths).
inline void expect_rows(const Tensor& t, std::int64_t rows, std::int64_t width, const char* what) {
  const shape_t& s = t.shape();
  if (!has_rows(t, rows, width))
    throw tensor_error(std::string(what) + ": expected shape [" + std::to_string(rows) + ", " +
                       std::to_string(width) + "], got " + shape_str(s));
}

// Index tensors (ids, positions, targets) live on the host whatever the
// backend: a device backend validates them there and uploads them with the
// op (cuda_backend::upload), where a device copy would be read back, a
// stream synchronisation, by every op taking it.

/// Copies `values` into the host i32 tensor `dst` (same element count).
inline void copy_i32(std::span<const std::int32_t> values, Tensor& dst) {
  if (static_cast<std::int64_t>(values.size()) != dst.numel() || dst.dev().kind != device_kind::cpu)
    throw tensor_error("copy_i32: " + std::to_string(values.size()) + " values for " + shape_str(dst.shape()) +
                       " on " + dst.dev().str() + " (index tensors stay on the host)");
  if (!values.empty()) std::memcpy(dst.data<std::int32_t>(), values.data(), values.size() * 4);
}

/// Fills the host i32 tensor `dst` with start, start+1, ... (positions of
/// consecutive tokens).
inline void fill_positions(Tensor& dst, std::int64_t start) {
  if (dst.dev().kind != device_kind::cpu)
    throw tensor_error("fill_positions: positions stay on the host, got a tensor on " + dst.dev().str());
  auto* p = dst.data<std::int32_t>();
  for (std::int64_t i = 0; i < dst.numel(); ++i) p[i] = static_cast<std::int32_t>(start + i);
}

}  // namespace corolla
