// kernels/cuda/linear_bf16_variants.cuh — the decode GEMV's launch
// variants (gemv_variants: the kernel, warps per block, warps per output,
// outputs per warp, rows per pass, whether the tuner may choose it) and the
// kernel of each (gemv_kernel_for). Included by linear_bf16.cu, and by
// tests/cuda_emulated/, which launches every variant on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/linear_bf16_kernels.cuh"
#include "kernels/cuda/linear_bf16_regroup_kernels.cuh"

namespace corolla::cuda {

namespace {

using gemv_kernel = void (*)(const float*, std::int64_t, std::int64_t, const std::uint16_t*, std::int64_t,
                             const float*, const float*, float*);

/// A launch of a 16-byte kernel: `warps` warps per block, `split` of them
/// to an output feature or `outs` outputs to each (grid: gemv_blocks).
struct gemv_variant {
  const char* name;
  int warps;
  int stages = 0;  ///< the cp.async kernel's ring slots per lane; 0: a register kernel
  /// Chosen by the tuner when fastest. The cp.async variants are timed but
  /// not chosen (COROLLA_GEMV=all or a fixed name only): alone they read
  /// the down projection 15 % faster, but chosen in decode they cost early
  /// launch its overlap (an H200 decoded 5 % slower), and the common
  /// shared-memory carve-out that restores it slows the register kernels as
  /// much (2026-11-30, docs/benchmarks.md).
  bool tuned = true;
  int split = 1;  ///< warps to an output (linear_bf16_split_kernel when more than 1)
  int outs = 1;   ///< outputs to a warp (linear_bf16_kernel's Outs)
  int rows = 1;   ///< rows of x per pass over the weights: more than 1, a candidate for several rows
};

/// Blocks of variant v's launch for `out` output features.
constexpr std::int64_t gemv_blocks(const gemv_variant& v, std::int64_t out) {
  const std::int64_t per_block = v.warps / v.split * v.outs;
  return (out + per_block - 1) / per_block;
}

/// Dynamic shared memory of variant v's launch.
constexpr std::size_t gemv_smem_bytes(const gemv_variant& v) {
  return static_cast<std::size_t>(v.warps) * 32 * static_cast<std::size_t>(v.stages) * 16;
}

/// Named "r<rows per pass>.u<loads in flight per lane>.w<warps per block>".
/// The first is the default: the kernel measured on 2026-11-22
/// (docs/benchmarks.md), and with r8.o2 and r8.u2 (56 registers to its 70)
/// the candidates for several rows.
/// The other r1 and the p, a and s variants are batch-1 kernels (one set
/// of accumulators; more rows would make a pass each): at 4 loads 40 registers against the default's 70, at
/// 8 and 16 loads more (80, 136) for more bytes in flight (ptxas, sm_90,
/// 2026-12-03; with one accumulator a row the default took 56). "p<depth>.w<warps>" are the
/// pipelined register kernel (linear_bf16_pipelined_kernel),
/// "a<stages>.w<warps>" the cp.async kernel (linear_bf16_async_kernel,
/// untuned: see gemv_variant::tuned), "s<warps to an output>.u<loads in
/// flight per lane>.w<warps per block>" the split kernel
/// (linear_bf16_split_kernel, one warp per class of an output),
/// "r<rows>.o<outputs to a warp>.u<loads>.w<warps>" the kernel of several
/// outputs to a warp (linear_bf16_kernel with Outs > 1).
constexpr gemv_variant gemv_variants[] = {
    {"r8.u4.w8", 8, 0, true, 1, 1, 8},
    {"r1.u4.w8", 8},
    {"r1.u4.w4", 4},
    {"r1.u8.w8", 8},
    {"r1.u8.w4", 4},
    {"r1.u16.w4", 4},
    {"a6.w8", 8, 6, false},
    {"a8.w8", 8, 8, false},
    {"a8.w4", 4, 8, false},
    {"p4.w8", 8},
    {"p6.w8", 8},
    {"p8.w8", 8},
    {"p4.w4", 4},
    {"p8.w4", 4},
    {"s2.u4.w8", 8, 0, true, gemv_classes},
    {"s2.u8.w8", 8, 0, true, gemv_classes},
    {"s2.u8.w4", 4, 0, true, gemv_classes},
    {"r8.o2.u2.w8", 8, 0, true, 1, 2, 8},
    {"r1.o2.u4.w8", 8, 0, true, 1, 2},
    {"r1.o2.u4.w4", 4, 0, true, 1, 2},
    {"r8.u2.w8", 8, 0, true, 1, 1, 8}};
constexpr int gemv_variant_count = static_cast<int>(sizeof gemv_variants / sizeof gemv_variants[0]);

/// The 16-byte kernel of variant i (as gemv_variants) with epilogue E.
template <gemv_epilogue E>
gemv_kernel gemv_kernel_for(int i) {
  switch (i) {
    case 1: return &linear_bf16_kernel<true, 1, 4, 8, 1, E>;
    case 2: return &linear_bf16_kernel<true, 1, 4, 4, 1, E>;
    case 3: return &linear_bf16_kernel<true, 1, 8, 8, 1, E>;
    case 4: return &linear_bf16_kernel<true, 1, 8, 4, 1, E>;
    case 5: return &linear_bf16_kernel<true, 1, 16, 4, 1, E>;
    case 6: return &linear_bf16_async_kernel<6, 8, E>;
    case 7: return &linear_bf16_async_kernel<8, 8, E>;
    case 8: return &linear_bf16_async_kernel<8, 4, E>;
    case 9: return &linear_bf16_pipelined_kernel<4, 8, E>;
    case 10: return &linear_bf16_pipelined_kernel<6, 8, E>;
    case 11: return &linear_bf16_pipelined_kernel<8, 8, E>;
    case 12: return &linear_bf16_pipelined_kernel<4, 4, E>;
    case 13: return &linear_bf16_pipelined_kernel<8, 4, E>;
    case 14: return &linear_bf16_split_kernel<4, 8, E>;
    case 15: return &linear_bf16_split_kernel<8, 8, E>;
    case 16: return &linear_bf16_split_kernel<8, 4, E>;
    case 17: return &linear_bf16_kernel<true, 2, 2, 8, 8, E>;
    case 18: return &linear_bf16_kernel<true, 2, 4, 8, 1, E>;
    case 19: return &linear_bf16_kernel<true, 2, 4, 4, 1, E>;
    case 20: return &linear_bf16_kernel<true, 1, 2, 8, 8, E>;
    default: return &linear_bf16_kernel<true, 1, 4, 8, 8, E>;
  }
}

/// The scalar kernel (any in, any alignment): 8 warps, 8 rows per pass.
constexpr int scalar_warps = 8;
template <gemv_epilogue E>
constexpr gemv_kernel gemv_scalar = &linear_bf16_kernel<false, 1, 1, scalar_warps, 8, E>;

}  // namespace
}  // namespace corolla::cuda
