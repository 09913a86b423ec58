// kernels/cpu/cpu_rope.cpp — rotary position embedding, HuggingFace
// rotate-half convention, with cached cos/sin tables.
//
// For head h and i < Dh/2 the pair (x[i], x[i + Dh/2]) is rotated by
// angle = pos * inv_freq(i) (kernels/rope_spec.hpp: plain theta^(-2i/Dh) or
// a HuggingFace rope_scaling type) and scaled by the spec's scale. inv_freq
// and the angle are computed in double, then cos/sin rounded to f32 once,
// so the table matches a float64 reference to f32 rounding even at large
// positions (an f32 angle would already be off by pos * 2^-24 radians).
//
// Allocation: a table per (spec, head_dim) is built the first time that
// pair is seen and rebuilt (doubling its positions) the first time a
// position beyond it is seen. Decode reuses the table and allocates nothing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"
#include "kernels/half.hpp"

namespace corolla::cpu {
namespace {

/// Smallest table built; positions are doubled from there.
constexpr std::int64_t min_table_positions = 256;

std::shared_ptr<const rope_table> build_table(const rope_spec& spec, int head_dim, std::int64_t positions) {
  auto t = std::make_shared<rope_table>();
  t->spec = spec;
  t->head_dim = head_dim;
  t->positions = positions;
  const int half = head_dim / 2;
  t->cos.resize(static_cast<std::size_t>(positions * half));
  t->sin.resize(static_cast<std::size_t>(positions * half));
  const double scale = spec.scale();
  for (int i = 0; i < half; ++i) {
    const double inv_freq = spec.inv_freq(i, head_dim);
    for (std::int64_t p = 0; p < positions; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      const auto k = static_cast<std::size_t>(p * half + i);
      t->cos[k] = static_cast<float>(scale * std::cos(angle));
      t->sin[k] = static_cast<float>(scale * std::sin(angle));
    }
  }
  return t;
}

}  // namespace

std::shared_ptr<const rope_table> cpu_backend_impl::rope_table_for(const rope_spec& spec, int head_dim,
                                                                   std::int64_t positions) {
  std::lock_guard<std::mutex> lock(rope_mutex_);
  for (auto& t : rope_tables_) {
    if (!(t->spec == spec) || t->head_dim != head_dim) continue;
    if (t->positions < positions)
      t = build_table(spec, head_dim, std::max(positions, 2 * t->positions));
    return t;  // a copy: callers keep their table alive if it is replaced
  }
  rope_tables_.push_back(
      build_table(spec, head_dim, std::max(positions, min_table_positions)));
  return rope_tables_.back();
}

void cpu_backend_impl::rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim,
                            const rope_spec& spec, bool inverse) {
  require_that(n_heads > 0, "rope", "n_heads must be positive");
  require_that(head_dim > 0 && head_dim % 2 == 0, "rope", "head_dim must be positive and even");
  require_that(spec.valid(), "rope", "theta and the scaling factors must be positive");
  require_host(x, dtype::f32, "rope x");
  require_that(x.rank() == 2, "rope x", "expected a 2-D [rows, heads * head_dim] tensor");
  const std::int64_t n = x.dim(0), width = std::int64_t{n_heads} * head_dim;
  require(x, dtype::f32, {n, width}, "rope x");
  require(positions, dtype::i32, {n}, "rope positions");
  if (n == 0) return;

  const std::int32_t* pos = positions.data<std::int32_t>();
  std::int32_t max_pos = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    if (pos[r] < 0)
      throw tensor_error("rope: negative position " + std::to_string(pos[r]) + " at row " +
                         std::to_string(r));
    max_pos = std::max(max_pos, pos[r]);
  }
  const std::shared_ptr<const rope_table> table =
      rope_table_for(spec, head_dim, std::int64_t{max_pos} + 1);

  const int half = head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  float* xp = x.data<float>();
  parallel_for(n, 3 * width, [&](std::int64_t r) {
    const float* c = table->cos.data() + std::int64_t{pos[r]} * half;
    const float* s = table->sin.data() + std::int64_t{pos[r]} * half;
    for (int h = 0; h < n_heads; ++h) {
      float* x1 = xp + r * width + std::int64_t{h} * head_dim;
      float* x2 = x1 + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i], sn = sign * s[i];
        x1[i] = a * c[i] - b * sn;
        x2[i] = b * c[i] + a * sn;
      }
    }
  });
}

void cpu_backend_impl::rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq,
                                     int hkv, int head_dim, const rope_spec& spec, bool rotate, void* k_out, void* v_out,
                                     dtype cache_type) {
  require_host(k, dtype::f32, "rope_store_kv k");
  require_host(v, dtype::f32, "rope_store_kv v");
  if (k.shape() != v.shape())
    throw tensor_error("rope_store_kv: k " + shape_str(k.shape()) + " and v " + shape_str(v.shape()) + " differ");
  if (rotate) {
    rope(q, positions, hq, head_dim, spec);
    rope(k, positions, hkv, head_dim, spec);
  }
  const auto n = static_cast<std::size_t>(k.numel());
  if (n > 0 && (k_out == nullptr || v_out == nullptr)) throw tensor_error("rope_store_kv: no destination rows");
  for (auto [src, dst] : {std::pair<const Tensor*, void*>{&k, k_out}, {&v, v_out}}) {
    switch (cache_type) {
      case dtype::f32: std::memcpy(dst, src->data<float>(), n * sizeof(float)); break;
      case dtype::bf16: f32_to_bf16(src->data<float>(), static_cast<std::uint16_t*>(dst), n); break;
      case dtype::f16: f32_to_f16(src->data<float>(), static_cast<std::uint16_t*>(dst), n); break;
      default:
        throw tensor_error(std::string("rope_store_kv: cache rows are f32, bf16 or f16, not ") + dtype_name(cache_type));
    }
  }
}

}  // namespace corolla::cpu
