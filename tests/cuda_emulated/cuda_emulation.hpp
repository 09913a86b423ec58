// tests/cuda_emulated/cuda_emulation.hpp — just enough of CUDA, as host C++,
// to run kernel source on the CPU: every thread of a block is a std::thread,
// blocks run one after another, and what the kernels use is defined here.
//
// What is emulated, and how strictly:
//  * threadIdx, blockIdx, gridDim, blockDim: per thread; 1-D or 2-D blocks
//    of any whole number of warps (launch_config), warps formed from the
//    linear thread index (x fastest), as on the GPU.
//  * __syncthreads, __syncwarp: barriers of the block and of the warp;
//    __shfl_xor_sync and __shfl_sync (float, double): through a per-warp
//    array between two warp barriers. Full masks only.
//  * Dynamic shared memory (COROLLA_BLOCK_SMEM): a fresh buffer of exactly
//    the launch's size per block, filled with NaN bytes, so a read of
//    anything not written shows up in the results. Static __shared__
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
//    (ThreadSanitizer sees the race otherwise). Every load and store checks
//    CUDA's preconditions: a 32-byte aligned pointer, ldm a multiple of 8
//    (16-bit elements) or 4 (f32), and a footprint inside the block's
//    shared memory.
// A broken precondition aborts with a message naming it.
//
// What it cannot see: a __syncthreads reached by only some threads hangs
// (until ctest's timeout) instead of failing; WMMA arguments that differ
// between lanes are not detected (each lane uses its own); a missing
// __syncwarp shows only when the timing exposes it (shared memory starts as
// NaN) or under ThreadSanitizer; a cp.async issued into a buffer before the
// barrier that frees it, while another warp still reads it, goes unseen (the
// copy lands only at the issuer's wait, never mid-read as it could on the
// GPU); and nothing about speed or the hardware's own rounding order.
#pragma once

#include <array>
#include <atomic>
#include <barrier>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
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

struct emulated_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local emulated_dim3 threadIdx, blockIdx, gridDim, blockDim;

namespace corolla::emulated {

/// What one lane hands to a warp-collective instruction (mma_16816,
/// ldmatrix_x4): its operand registers, or its row address.
struct lane_slot {
  std::uint32_t r[6] = {};
  const unsigned char* addr = nullptr;
};

/// The barriers, shuffle buffers and shared memory of the block running now.
struct block_state {
  explicit block_state(unsigned threads) : block(threads), warps(threads / 32), shuffle(threads), lanes(threads) {
    for (auto& w : warps) w = std::make_unique<std::barrier<>>(32);
  }
  std::barrier<> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<double> shuffle;  ///< one slot per thread (a float or a double)
  /// Per thread, two sets of collective slots used in turn: a lane may run
  /// one collective ahead of its warp (each has one barrier), never two.
  std::vector<std::array<lane_slot, 2>> lanes;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
};
inline block_state* current = nullptr;

inline unsigned char* block_smem() { return current->smem; }

/// Aborts unless bytes [p, p + bytes) lie in the block's shared memory.
inline void check_in_smem(const void* p, std::size_t bytes, const char* what) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), base = reinterpret_cast<std::uintptr_t>(current->smem);
  if (a < base || a + bytes > base + current->smem_bytes)
    COROLLA_EMULATION_FAIL("%s: %zu bytes at shared-memory offset %lld, outside the block's %zu bytes", what, bytes,
                           static_cast<long long>(a - base), current->smem_bytes);
}

/// The launch configuration: grid (x, y), threads per block along x,
/// dynamic shared memory, threads per block along y (x * y a multiple of 32).
struct launch_config {
  unsigned grid_x = 1, grid_y = 1, threads = 128;
  std::size_t smem_bytes = 0;
  unsigned block_y = 1;
};

/// The calling thread's index in its block, x fastest.
inline unsigned linear_thread() { return threadIdx.x + threadIdx.y * blockDim.x; }

/// Runs kernel(args...) over the grid, one block at a time, each block's
/// threads as std::threads.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), const launch_config& cfg, const Args&... args) {
  const unsigned block_threads = cfg.threads * cfg.block_y;
  if (block_threads == 0 || block_threads % 32 != 0)
    COROLLA_EMULATION_FAIL("blocks of %u threads: the emulation runs whole warps", block_threads);
  for (unsigned by = 0; by < cfg.grid_y; ++by)
    for (unsigned bx = 0; bx < cfg.grid_x; ++bx) {
      std::vector<unsigned char> smem(cfg.smem_bytes + 128, 0xff);  // 0xffffffff: a NaN
      block_state state(block_threads);
      state.smem = smem.data() + (128 - reinterpret_cast<std::uintptr_t>(smem.data()) % 128) % 128;
      state.smem_bytes = cfg.smem_bytes;
      current = &state;
      std::vector<std::thread> threads;
      threads.reserve(block_threads);
      for (unsigned t = 0; t < block_threads; ++t)
        threads.emplace_back([=, &args...] {
          threadIdx = {t % cfg.threads, t / cfg.threads, 0};
          blockIdx = {bx, by, 0};
          gridDim = {cfg.grid_x, cfg.grid_y, 1};
          blockDim = {cfg.threads, cfg.block_y, 1};
          kernel(args...);
        });
      for (auto& t : threads) t.join();
      current = nullptr;
    }
}

}  // namespace corolla::emulated

inline void __syncthreads() { corolla::emulated::current->block.arrive_and_wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) COROLLA_EMULATION_FAIL("__syncwarp with mask %x: only full warps", mask);
  corolla::emulated::current->warps[corolla::emulated::linear_thread() >> 5]->arrive_and_wait();
}
namespace corolla::emulated {
/// What lane source(lane) of the calling warp passed as `v`.
template <class T, class Source>
T shuffle(unsigned mask, T v, Source source, const char* what) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "the emulation shuffles floats and doubles");
  if (mask != 0xffffffffu) COROLLA_EMULATION_FAIL("%s with mask %x: only full warps", what, mask);
  auto& s = *current;
  const unsigned me = linear_thread(), w = me >> 5, lane = me & 31;
  s.shuffle[me] = v;
  s.warps[w]->arrive_and_wait();
  const T r = static_cast<T>(s.shuffle[w * 32 + (source(lane) & 31u)]);
  s.warps[w]->arrive_and_wait();
  return r;
}
}  // namespace corolla::emulated

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return corolla::emulated::shuffle(
      mask, v, [=](unsigned lane) { return lane ^ static_cast<unsigned>(lane_mask); }, "__shfl_xor_sync");
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane) {
  return corolla::emulated::shuffle(
      mask, v, [=](unsigned) { return static_cast<unsigned>(src_lane); }, "__shfl_sync");
}

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
inline thread_local bool producers_awaited = false;  ///< each emulated thread is a fresh std::thread
inline void check_not_produced(const void* p, std::size_t bytes, const char* what) {
  if (producers_awaited) return;
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
inline void await_producers() { corolla::emulated::producers_awaited = true; }
inline void prefetch_l2(const void*) {}
}  // namespace corolla::cuda

namespace corolla::emulated {
/// The calling thread's cp.async copies: committed groups, oldest first,
/// and the copies issued since the last commit.
struct async_copy {
  void* dst;
  const void* src;
};
inline thread_local std::vector<std::vector<async_copy>> async_groups;
inline thread_local std::vector<async_copy> async_open;
}  // namespace corolla::emulated

namespace corolla::cuda {
inline void async_copy16(void* dst, const void* src) {
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 || reinterpret_cast<std::uintptr_t>(src) % 16)
    COROLLA_EMULATION_FAIL("async_copy16 from %p to %p: not 16-byte aligned", src, dst);
  corolla::emulated::check_in_smem(dst, 16, "async_copy16");
  corolla::emulated::check_not_produced(src, 16, "async_copy16");
  corolla::emulated::async_open.push_back({dst, src});
}
inline void async_commit() {
  corolla::emulated::async_groups.push_back(std::move(corolla::emulated::async_open));
  corolla::emulated::async_open.clear();
}
template <int N>
void async_wait() {
  auto& groups = corolla::emulated::async_groups;
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
/// A real atomic add: the block's threads run concurrently.
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

// ---- mma.sync and ldmatrix (kernels/cuda/mma_sync.cuh) ---------------------------------

namespace corolla::emulated {
inline thread_local unsigned collective_set = 0;  ///< which of the two slot sets this thread's next collective uses

/// Publishes `mine` as the calling lane's slot, waits for the warp, and
/// returns the warp's 32 slots of this collective (valid until the lane's
/// next collective but one).
inline const lane_slot* warp_collective(const lane_slot& mine) {
  auto& s = *current;
  const unsigned me = linear_thread(), w = me >> 5, set = collective_set;
  s.lanes[me][set] = mine;
  s.warps[w]->arrive_and_wait();
  collective_set ^= 1u;
  thread_local lane_slot warp[32];
  for (unsigned l = 0; l < 32; ++l) warp[l] = s.lanes[w * 32 + l][set];
  return warp;
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
