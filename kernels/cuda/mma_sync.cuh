// kernels/cuda/mma_sync.cuh — the warp-level tensor-core instructions whose
// register layouts PTX documents, so kernels can keep products in registers
// and work on them element by element (WMMA's layouts are unspecified):
//
//  * mma_16816<M>(d, a, b): d[16x8] += a[16x16] . b[16x8], M = bf16 or f16
//    operands, f32 accumulators (mma.sync.aligned.m16n8k16.row.col). With
//    g = lane / 4 and c = lane % 4, a lane holds
//      a[0]: A(g, 2c..2c+1)      a[1]: A(g+8, 2c..2c+1)
//      a[2]: A(g, 2c+8..2c+9)    a[3]: A(g+8, 2c+8..2c+9)
//      b[0]: B(2c..2c+1, g)      b[1]: B(2c+8..2c+9, g)
//      d[0..1]: D(g, 2c..2c+1)   d[2..3]: D(g+8, 2c..2c+1)
//    each 32-bit register two 16-bit values, the lower-indexed one in the
//    low half (pack_pair). An accumulator's pairs are therefore an A
//    operand's pairs: a 16x16 block of scores in two accumulators, rounded
//    to 16 bits, is the A operand of the next product without a shuffle.
//  * ldmatrix_x4(r, row) / ldmatrix_x4_trans(r, row): four 8x8 matrices of
//    16-bit values from shared memory; lanes 8i..8i+7 give the addresses of
//    matrix i's eight rows (16 bytes each, 16-byte aligned), and r[i] is
//    matrix i's (g, 2c..2c+1) pair, or with _trans its (2c..2c+1, g) pair.
//
// sm_80 and newer. Under the CPU emulation of tests/cuda_emulated, which
// defines the three instructions first, the lanes exchange their registers
// and addresses exactly as laid out above, so a kernel that misplaces a
// value fails there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace corolla::cuda {

/// Two values rounded to the 16-bit type M, `lo` in the low half.
template <class M>
__device__ __forceinline__ std::uint32_t pack_pair(float lo, float hi) {
  std::uint32_t u;
  if constexpr (std::is_same_v<M, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    std::memcpy(&u, &h, 4);
  } else {
    static_assert(std::is_same_v<M, __nv_bfloat16>, "bf16 or f16 pairs");
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&u, &h, 4);
  }
  return u;
}

#ifndef COROLLA_CUDA_EMULATION

/// d += a . b (m16n8k16, f32 accumulators; see the file comment for the layouts).
template <class M>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<M, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/// Four 8x8 16-bit matrices from shared memory; `row` is this lane's row address.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
#endif
}

/// As ldmatrix_x4, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
#endif
}

#endif  // COROLLA_CUDA_EMULATION (cuda_emulation.hpp defines the three)

}  // namespace corolla::cuda
