// tests/cuda_emulated/emulated_tensor_cores.hpp — part of
// cuda_emulation.hpp (included by it only, last): mma.sync and ldmatrix as
// warp-collective operations, and nvcuda::wmma's 16x16x16 fragments, as
// cuda_emulation.hpp's opening comment describes them.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- mma.sync and ldmatrix (kernels/cuda/mma_sync.cuh) ---------------------------------

namespace corolla::emulated {
/// Publishes `mine` as the calling lane's slot, waits for the warp, and
/// returns the warp's 32 slots of this collective (valid until the lane's
/// next collective).
inline const lane_slot* warp_collective(const lane_slot& mine) {
  auto& s = *current;
  emulated_thread& t = *running;
  const unsigned me = linear_thread(), w = me >> 5, set = t.collective_set;
  s.lanes[me][set] = mine;
  arrive_and_wait(s.warps[w]);
  t.collective_set ^= 1u;
  for (unsigned l = 0; l < 32; ++l) t.warp_copy[l] = s.lanes[w * 32 + l][set];
  return t.warp_copy;
}

/// The 16-bit half `half` of register u as f32 (M = __nv_bfloat16 or __half).
template <class M>
float half_of(std::uint32_t u, int half) {
  return to_float(M{static_cast<std::uint16_t>(half ? u >> 16 : u & 0xffffu)});
}

template <bool Trans>
void ldmatrix(std::uint32_t (&r)[4], const void* row) {
  if (reinterpret_cast<std::uintptr_t>(row) % 16)
    COROLLA_EMULATION_FAIL("ldmatrix: row address %p is not 16-byte aligned", row);
  check_in_smem(row, 16, "ldmatrix");
  lane_slot mine;
  mine.addr = static_cast<const unsigned char*>(row);
  const lane_slot* warp = warp_collective(mine);
  const unsigned lane = linear_thread() & 31, g = lane >> 2, c = lane & 3;
  for (unsigned i = 0; i < 4; ++i) {
    if (!Trans) {
      std::memcpy(&r[i], warp[8 * i + g].addr + 4 * c, 4);  // row g, columns 2c and 2c + 1
    } else {
      std::uint16_t lo, hi;  // rows 2c and 2c + 1, column g
      std::memcpy(&lo, warp[8 * i + 2 * c].addr + 2 * g, 2);
      std::memcpy(&hi, warp[8 * i + 2 * c + 1].addr + 2 * g, 2);
      r[i] = std::uint32_t{lo} | std::uint32_t{hi} << 16;
    }
  }
}
}  // namespace corolla::emulated

namespace corolla::cuda {
template <class M>
void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  static_assert(std::is_same_v<M, __nv_bfloat16> || std::is_same_v<M, __half>, "bf16 or f16 operands");
  using corolla::emulated::half_of;
  corolla::emulated::lane_slot mine;
  for (int i = 0; i < 4; ++i) mine.r[i] = a[i];
  mine.r[4] = b[0], mine.r[5] = b[1];
  const corolla::emulated::lane_slot* warp = corolla::emulated::warp_collective(mine);
  // A(i, k): register (i >= 8) + 2 (k >= 8) of lane 4 (i % 8) + (k % 8) / 2,
  // half k % 2; B(k, j): register 4 + (k >= 8) of lane 4 j + (k % 8) / 2.
  const auto A = [&](int i, int k) { return half_of<M>(warp[4 * (i % 8) + (k % 8) / 2].r[(i >= 8) + 2 * (k >= 8)], k % 2); };
  const auto B = [&](int k, int j) { return half_of<M>(warp[4 * j + (k % 8) / 2].r[4 + (k >= 8)], k % 2); };
  const int lane = static_cast<int>(corolla::emulated::linear_thread() & 31), g = lane >> 2, c = lane & 3;
  for (int e = 0; e < 4; ++e) {
    const int i = g + 8 * (e >> 1), j = 2 * c + (e & 1);
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) sum += A(i, k) * B(k, j);  // 16-bit x 16-bit is exact in f32
    d[e] = sum + d[e];
  }
}
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) { corolla::emulated::ldmatrix<false>(r, row); }
inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) { corolla::emulated::ldmatrix<true>(r, row); }
}  // namespace corolla::cuda

// ---- WMMA ---------------------------------------------------------------------------

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 fragments only");
  float m[16][16];  ///< the logical matrix (A: M x K, B: K x N, accumulator: M x N)
};

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float v) {
  for (auto& row : f.m)
    for (float& x : row) x = v;
}

template <class Use, class E, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, E, Layout>& f, const E* p, unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>);
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "bf16 or f16 operands");
  if (reinterpret_cast<std::uintptr_t>(p) % 32) COROLLA_EMULATION_FAIL("load_matrix_sync: pointer not 32-byte aligned");
  if (ldm % 8) COROLLA_EMULATION_FAIL("load_matrix_sync: 16-bit ldm %u is not a multiple of 8", ldm);
  corolla::emulated::check_in_smem(p, (15 * std::size_t{ldm} + 16) * 2, "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.m[r][c] = corolla::emulated::to_float(std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r]);
}

template <class E, class TA, class TB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, E, TA>& a,
              const fragment<matrix_b, 16, 16, 16, E, TB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "bf16 or f16 operands");
  float t[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = 0.0f;
      for (int k = 0; k < 16; ++k) s += a.m[i][k] * b.m[k][j];  // 16-bit x 16-bit is exact in f32
      t[i][j] = s + c.m[i][j];
    }
  std::memcpy(d.m, t, sizeof t);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32) COROLLA_EMULATION_FAIL("store_matrix_sync: pointer not 32-byte aligned");
  if (ldm % 4) COROLLA_EMULATION_FAIL("store_matrix_sync: f32 ldm %u is not a multiple of 4", ldm);
  corolla::emulated::check_in_smem(p, (15 * std::size_t{ldm} + 16) * 4, "store_matrix_sync");
  for (unsigned e = corolla::emulated::linear_thread() & 31; e < 256; e += 32) {
    const unsigned r = e / 16, c = e % 16;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.m[r][c];
  }
}
}  // namespace nvcuda::wmma
