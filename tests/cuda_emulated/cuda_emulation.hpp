// tests/cuda_emulated/cuda_emulation.hpp — just enough of CUDA, as host C++,
// to run kernel source on the CPU: every thread of a block is a fiber
// (Boost.Context, with its own stack) on the launching thread, the block's fibers
// are scheduled cooperatively (each runs until it waits at a barrier or
// returns), blocks run one after another, and what the kernels use is
// defined here. The scheduler makes passes over the block, seeded by the
// block index (a run repeats): some resume every thread once in a shuffled
// order, others run warp after warp, in a shuffled order, as far as each
// goes alone. A read of what another thread writes, or a write over what
// another still reads, without the barrier that orders them comes out
// wrong in some pass (shared memory starts as NaN). Threads, barriers and
// shuffles are in emulated_threads.hpp, mma.sync, ldmatrix and WMMA in
// emulated_tensor_cores.hpp; a kernel test includes this header only.
//
// What is emulated, and how strictly:
//  * threadIdx, blockIdx, gridDim, blockDim: per thread (the scheduler sets
//    them before it resumes a fiber); 1-D or 2-D blocks of any whole number
//    of warps (launch_config), warps formed from the linear thread index (x
//    fastest), as on the GPU.
//  * __syncthreads, __syncwarp: barriers of the block and of the warp (the
//    last thread to arrive goes on; the others wait to be resumed);
//    __shfl_xor_sync and __shfl_sync (float, double): through a per-warp
//    array between two warp barriers. Full masks only. A barrier some
//    threads never reach (they returned, or wait at another) aborts,
//    counting the threads at __syncthreads, at a warp barrier and returned,
//    instead of hanging.
//  * Dynamic shared memory (COROLLA_BLOCK_SMEM): a fresh buffer of exactly
//    the launch's size per block, filled with NaN bytes, so a read of
//    anything not written shows up in the results. Plain reads and writes
//    of it are not bounds-checked (cp.async, ldmatrix and WMMA are). Static __shared__
//    arrays become function-local statics, which the threads of a block
//    share (blocks run one after another); they keep what the previous
//    block left instead of starting as NaN.
//  * bf16 and f16: __nv_bfloat16, __nv_bfloat162, __half and __half2 with
//    round-to-nearest-even conversions (__floats2bfloat162_rn,
//    __float2bfloat16_rn, __float2half_rn, __floats2half2_rn, subnormals
//    included) and their
//    widening; __fdiv_rn, __fmul_rn, __fadd_rn and __fmaf_rn as host IEEE
//    arithmetic (fma rounded once; the product and the sum materialised,
//    so GCC, which contracts a * b + c under -march=native, cannot fuse
//    them into an FMA: CUDA never contracts its _rn intrinsics); atomicAdd
//    on floats as a real atomic (std::atomic_ref); float4 with its 16-byte
//    alignment checked on every copy; uint4, __uint_as_float, and __ldg /
//    __ldcs as plain loads with their alignment checked.
//  * griddepcontrol (kernels/cuda/grid_dependency.cuh): allow_dependents and
//    prefetch_l2 do nothing; await_producers marks the thread, and an __ldg
//    or __ldcs of a range a test lists in emulated::produced by a thread
//    not yet marked aborts (a read that could see stale data on the GPU).
//  * cp.async (kernels/cuda/async_copy.cuh): async_copy16 checks that the
//    destination lies in the block's shared memory, both addresses are
//    16-byte aligned and the source is not a producer's output (as __ldcs),
//    and queues the copy; async_commit closes the thread's queued copies
//    into a group; async_wait<N> performs the copies of all but the newest
//    N groups. Shared memory read before its wait still holds its NaN.
//  * mma.sync and ldmatrix (kernels/cuda/mma_sync.cuh): mma_16816 and
//    ldmatrix_x4 / ldmatrix_x4_trans are warp-collective here as on the
//    GPU: each lane publishes its registers (or its row address) and builds
//    its results from the other lanes' exactly as PTX lays them out, so a
//    kernel that puts a value in the wrong lane or half-register computes
//    wrong results. ldmatrix checks that every row address is 16-byte
//    aligned and its 16 bytes inside the block's shared memory. The m16n8k16
//    product sums its 16 exact products in f32, in order, then adds the
//    accumulator.
//  * nvcuda::wmma for 16x16x16 bf16 x bf16 or f16 x f16 -> f32: every lane's fragment
//    holds the whole logical matrix (CUDA's element-to-lane mapping is
//    unspecified, and the kernels must not rely on it). load_matrix_sync
//    reads row_major or col_major exactly as CUDA documents them;
//    store_matrix_sync has lane l write the elements e with e % 32 == l, so
//    a lane reading what another lane stored needs a __syncwarp in between
//    (a shuffled order reads the NaN otherwise). Every load and store checks
//    CUDA's preconditions: a 32-byte aligned pointer, ldm a multiple of 8
//    (16-bit elements) or 4 (f32), and a footprint inside the block's
//    shared memory.
// A broken precondition aborts with a message naming it.
//
// What it cannot see: WMMA arguments that differ between lanes (each lane
// uses its own); a missing __syncwarp or __syncthreads only when no
// shuffled order makes a thread read before the write it needs (shared
// memory starts as NaN); a race within one thread's stretch between
// barriers, since fibers do not interleave there; a cp.async issued into a buffer before the
// barrier that frees it, while another warp still reads it, goes unseen (the
// copy lands only at the issuer's wait, never mid-read as it could on the
// GPU); and nothing about speed or the hardware's own rounding order.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>


#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(n) alignas(n)
#define __shared__ static
#define __CUDA_ARCH__ 800
#define COROLLA_BLOCK_SMEM(name) unsigned char* const name = ::corolla::emulated::block_smem()

#define COROLLA_EMULATION_FAIL(...)                                              \
  do {                                                                           \
    std::fprintf(stderr, "cuda emulation: %s:%d: ", __FILE__, __LINE__);         \
    std::fprintf(stderr, __VA_ARGS__);                                           \
    std::fprintf(stderr, "\n");                                                  \
    std::abort();                                                                \
  } while (0)

#include "tests/cuda_emulated/emulated_threads.hpp"

// ---- vector types and bf16 -------------------------------------------------------

struct alignas(16) float4 {
  float x = 0, y = 0, z = 0, w = 0;
  float4() = default;
  float4(float a, float b, float c, float d) : x(a), y(b), z(c), w(d) {}
  float4(const float4& o) : x(o.x), y(o.y), z(o.z), w(o.w) { check(&o); }
  float4& operator=(const float4& o) {
    check(this);
    check(&o);
    x = o.x, y = o.y, z = o.z, w = o.w;
    return *this;
  }
  static void check(const void* p) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16) COROLLA_EMULATION_FAIL("float4 access at %p: not 16-byte aligned", p);
  }
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// ---- programmatic dependent launch (kernels/cuda/grid_dependency.cuh) --------------

namespace corolla::emulated {
/// Memory a test declares written by the kernel before the one it launches
/// (the producer, under programmatic dependent launch). An __ldg or __ldcs
/// of it by a thread that has not called await_producers() aborts: on the
/// GPU that read could see the producer's old data.
struct produced_range {
  const void* begin = nullptr;
  std::size_t bytes = 0;
};
inline std::vector<produced_range> produced;
inline void check_not_produced(const void* p, std::size_t bytes, const char* what) {
  if (!running || running->producers_awaited) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (const produced_range& r : produced) {
    const auto b = reinterpret_cast<std::uintptr_t>(r.begin);
    if (a < b + r.bytes && b < a + bytes)
      COROLLA_EMULATION_FAIL("%s at %p reads the producer's output before await_producers()", what, p);
  }
}
}  // namespace corolla::emulated

#define COROLLA_CUDA_EMULATION 1
namespace corolla::cuda {
inline void allow_dependents() {}
inline void await_producers() { corolla::emulated::running->producers_awaited = true; }
inline void prefetch_l2(const void*) {}
}  // namespace corolla::cuda

namespace corolla::cuda {
inline void async_copy16(void* dst, const void* src) {
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 || reinterpret_cast<std::uintptr_t>(src) % 16)
    COROLLA_EMULATION_FAIL("async_copy16 from %p to %p: not 16-byte aligned", src, dst);
  corolla::emulated::check_in_smem(dst, 16, "async_copy16");
  corolla::emulated::check_not_produced(src, 16, "async_copy16");
  corolla::emulated::running->async_open.push_back({dst, src});
}
inline void async_commit() {
  auto& t = *corolla::emulated::running;
  t.async_groups.push_back(std::move(t.async_open));
  t.async_open.clear();
}
template <int N>
void async_wait() {
  auto& groups = corolla::emulated::running->async_groups;
  while (groups.size() > static_cast<std::size_t>(N)) {
    for (const auto& c : groups.front()) std::memcpy(c.dst, c.src, 16);
    groups.erase(groups.begin());
  }
}
}  // namespace corolla::cuda

/// The read-only and streaming loads: plain loads here, their alignment
/// checked, and (see produced_range) that they do not read a producer's
/// output before await_producers().
template <class T>
T __ldg(const T* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(T))
    COROLLA_EMULATION_FAIL("__ldg at %p: not %zu-byte aligned", static_cast<const void*>(p), alignof(T));
  corolla::emulated::check_not_produced(p, sizeof(T), "__ldg");
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(T))
    COROLLA_EMULATION_FAIL("__ldcs at %p: not %zu-byte aligned", static_cast<const void*>(p), alignof(T));
  corolla::emulated::check_not_produced(p, sizeof(T), "__ldcs");
  return *p;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct __nv_bfloat16 {
  std::uint16_t bits;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
  __nv_bfloat162(const __nv_bfloat162&) = default;
  __nv_bfloat162& operator=(const __nv_bfloat162& o) {
    if (reinterpret_cast<std::uintptr_t>(this) % 4)
      COROLLA_EMULATION_FAIL("__nv_bfloat162 store at %p: not 4-byte aligned", static_cast<void*>(this));
    x = o.x, y = o.y;
    return *this;
  }
};

namespace corolla::emulated {
/// f32 -> bf16 rounding to nearest even, as __float2bfloat16_rn.
inline std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float to_float(__nv_bfloat16 h) {
  const std::uint32_t u = std::uint32_t{h.bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace corolla::emulated

inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {{corolla::emulated::bf16_bits(a)}, {corolla::emulated::bf16_bits(b)}};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {corolla::emulated::bf16_bits(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return corolla::emulated::to_float(h); }

struct __half {
  std::uint16_t bits;
};

namespace corolla::emulated {
/// f32 -> f16 rounding to nearest even (subnormals, overflow to infinity,
/// NaN kept), as __float2half_rn.
inline std::uint16_t f16_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // 65520 and up: infinity
  auto round_shift = [](std::uint32_t m, int shift) {
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return r;
  };
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // at most 2^-25: rounds to 0
    const int e = static_cast<int>(a >> 23);
    return static_cast<std::uint16_t>(sign | round_shift((a & 0x7fffffu) | 0x800000u, 126 - e));
  }
  return static_cast<std::uint16_t>(sign | (round_shift(a, 13) - (112u << 10)));
}
inline float from_f16(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  std::uint32_t x;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    std::memcpy(&x, &v, 4);
    x |= sign;
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}  // namespace corolla::emulated

inline __half __float2half_rn(float f) { return {corolla::emulated::f16_bits(f)}; }
inline float __half2float(__half h) { return corolla::emulated::from_f16(h.bits); }

struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  __half2(__half a, __half b) : x(a), y(b) {}
  __half2(const __half2&) = default;
  __half2& operator=(const __half2& o) {
    if (reinterpret_cast<std::uintptr_t>(this) % 4)
      COROLLA_EMULATION_FAIL("__half2 store at %p: not 4-byte aligned", static_cast<void*>(this));
    x = o.x, y = o.y;
    return *this;
  }
};
inline __half2 __floats2half2_rn(float a, float b) {
  return {{corolla::emulated::f16_bits(a)}, {corolla::emulated::f16_bits(b)}};
}

namespace corolla::emulated {
/// A WMMA operand element as f32 (exact for both 16-bit types).
inline float to_float(__half h) { return from_f16(h.bits); }
}  // namespace corolla::emulated

// ---- arithmetic intrinsics and atomics -------------------------------------------------

namespace corolla::emulated {
/// v, opaque to the optimiser: the operation that made it cannot be fused
/// with the one that uses it. CUDA never contracts its _rn intrinsics into
/// an FMA; GCC contracts a * b + c on a host with FMA (-march=native)
/// unless the product is materialised.
inline float opaque(float v) {
#if defined(__GNUC__) && defined(__SSE_MATH__)
  asm("" : "+x"(v));
#else
  volatile float t = v;
  v = t;
#endif
  return v;
}
}  // namespace corolla::emulated

/// IEEE f32 division, product and sum rounded to nearest, as the host's,
/// and never contracted with the operation before or after (as on CUDA).
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return corolla::emulated::opaque(a * b); }
inline float __fadd_rn(float a, float b) {
  return corolla::emulated::opaque(corolla::emulated::opaque(a) + corolla::emulated::opaque(b));
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
/// An atomic add (the block's fibers do not interleave within it).
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

#include "tests/cuda_emulated/emulated_tensor_cores.hpp"
