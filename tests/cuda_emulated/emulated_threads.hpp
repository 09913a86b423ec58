// tests/cuda_emulated/emulated_threads.hpp — part of cuda_emulation.hpp
// (included by it only, after its macros): CUDA's threads, blocks and
// launches as cooperatively scheduled fibers (Boost.Context), the block and
// warp barriers, and warp shuffles. The scheduling rules are in
// cuda_emulation.hpp's opening comment.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>

struct emulated_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
/// The running thread's indices: the scheduler sets them before it resumes
/// a fiber (all fibers share the launching thread).
inline emulated_dim3 threadIdx, blockIdx, gridDim, blockDim;

namespace corolla::emulated {

/// What one lane hands to a warp-collective instruction (mma_16816,
/// ldmatrix_x4): its operand registers, or its row address.
struct lane_slot {
  std::uint32_t r[6] = {};
  const unsigned char* addr = nullptr;
};

/// A barrier of cooperatively scheduled threads: the last to arrive starts
/// its next phase and goes on; the others wait until the phase changed.
struct coop_barrier {
  unsigned expected = 0, arrived = 0;
  std::uint64_t phase = 0;
};

/// A cp.async copy queued by a thread.
struct async_copy {
  void* dst;
  const void* src;
};

/// One emulated CUDA thread: its fiber, and what CUDA keeps per thread.
struct emulated_thread {
  boost::context::fiber fiber;      ///< its own, while suspended
  boost::context::fiber scheduler;  ///< the scheduler's, while it runs
  emulated_dim3 index;
  bool finished = false;
  const coop_barrier* waiting = nullptr;  ///< the barrier it waits at, or none
  std::uint64_t waiting_phase = 0;        ///< the phase it waits to end
  bool producers_awaited = false;         ///< await_producers() was called
  /// cp.async: committed groups, oldest first, and the copies issued since
  /// the last commit.
  std::vector<std::vector<async_copy>> async_groups;
  std::vector<async_copy> async_open;
  unsigned collective_set = 0;  ///< which of the two slot sets its next collective uses
  lane_slot warp_copy[32];      ///< its warp's slots of its last collective
};

/// The barriers, shuffle buffers and shared memory of the block running now.
struct block_state {
  explicit block_state(unsigned threads) : warps(threads / 32), shuffle(threads), lanes(threads) {
    block.expected = threads;
    for (auto& w : warps) w.expected = 32;
  }
  coop_barrier block;
  std::vector<coop_barrier> warps;
  std::vector<double> shuffle;  ///< one slot per thread (a float or a double)
  /// Per thread, two sets of collective slots used in turn: a lane may run
  /// one collective ahead of its warp (each has one barrier), never two.
  std::vector<std::array<lane_slot, 2>> lanes;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
};
inline block_state* current = nullptr;
inline emulated_thread* running = nullptr;  ///< the thread whose fiber runs now
inline void (*kernel_body)(const void*) = nullptr;  ///< runs the launched kernel with its arguments
inline const void* kernel_args = nullptr;

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

/// Arrives at `b` and waits (back in the scheduler) until its phase ends.
inline void arrive_and_wait(coop_barrier& b) {
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.phase;
    return;
  }
  emulated_thread& me = *running;
  me.waiting = &b;
  me.waiting_phase = b.phase;
  me.scheduler = std::move(me.scheduler).resume();
}

/// Fiber stacks, kept for the process's later blocks: each above a guard
/// page, so an overflow faults instead of corrupting its neighbour.
struct fiber_stack_pool {
  static constexpr std::size_t bytes = 1 << 20;
  static std::vector<unsigned char*>& free_stacks() {
    static std::vector<unsigned char*> free;
    return free;
  }
  boost::context::stack_context allocate() {
    auto& free = free_stacks();
    if (free.empty()) {
      const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (p == MAP_FAILED) COROLLA_EMULATION_FAIL("no memory for a fiber stack");
      if (mprotect(p, page, PROT_NONE) != 0) COROLLA_EMULATION_FAIL("no guard page for a fiber stack");
      free.push_back(static_cast<unsigned char*>(p) + page);
    }
    boost::context::stack_context sc;
    sc.size = bytes;
    sc.sp = free.back() + bytes;  // stacks grow down
    free.pop_back();
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) noexcept {
    free_stacks().push_back(static_cast<unsigned char*>(sc.sp) - sc.size);
  }
};

inline boost::context::fiber fiber_main(boost::context::fiber&& scheduler) {
  running->scheduler = std::move(scheduler);
  kernel_body(kernel_args);
  running->finished = true;
  return std::move(running->scheduler);
}

/// What a block's threads wait for when none can run: names the barriers.
[[noreturn]] inline void deadlock(const block_state& state, const std::vector<emulated_thread>& threads) {
  const auto n = static_cast<unsigned>(threads.size());
  unsigned finished = 0, at_block = 0, at_warp = 0;
  for (unsigned t = 0; t < n; ++t) {
    finished += threads[t].finished;
    at_block += threads[t].waiting == &state.block;
    at_warp += !threads[t].finished && threads[t].waiting != &state.block;
  }
  COROLLA_EMULATION_FAIL(
      "block (%u, %u) of %u threads cannot go on: %u wait at __syncthreads, %u at a warp barrier "
      "(__syncwarp, a shuffle or a warp collective), %u returned: a barrier not every thread reaches",
      blockIdx.x, blockIdx.y, n, at_block, at_warp, finished);
}

/// The block's schedule: a xorshift64 stream seeded by the block index.
struct schedule_rng {
  std::uint64_t state;
  std::uint64_t next() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  }
  /// Shuffles [first, first + n) (Fisher-Yates).
  void shuffle(unsigned* first, unsigned n) {
    for (unsigned i = n; i > 1; --i) std::swap(first[i - 1], first[next() % i]);
  }
};

/// Resumes `th` unless it has returned or its barrier's phase has not
/// ended; true when it ran.
inline bool resume_if_runnable(emulated_thread& th) {
  if (th.finished || (th.waiting && th.waiting->phase == th.waiting_phase)) return false;
  th.waiting = nullptr;
  threadIdx = th.index;
  running = &th;
  th.fiber = std::move(th.fiber).resume();
  running = nullptr;
  return true;
}

/// Runs one block's threads as fibers until every one has returned, in
/// passes of two kinds, chosen at random: every thread that can run once,
/// in a shuffled order (a lane reading before its warp's barrier is caught
/// here); or warp by warp in a shuffled order, each run as far as it goes
/// alone (to a __syncthreads or its end: a warp overwriting what another
/// still reads before a block barrier is caught there).
inline void run_block(std::vector<emulated_thread>& threads, const launch_config& cfg, unsigned bx, unsigned by) {
  const auto n = static_cast<unsigned>(threads.size());
  for (unsigned t = 0; t < n; ++t) {
    emulated_thread& th = threads[t];
    th.index = {t % cfg.threads, t / cfg.threads, 0};
    th.finished = false;
    th.waiting = nullptr;
    th.producers_awaited = false;
    th.async_groups.clear();
    th.async_open.clear();
    th.collective_set = 0;
    th.fiber = boost::context::fiber(std::allocator_arg, fiber_stack_pool{}, fiber_main);
  }
  blockIdx = {bx, by, 0};
  gridDim = {cfg.grid_x, cfg.grid_y, 1};
  blockDim = {cfg.threads, cfg.block_y, 1};
  const unsigned warps = n / 32;
  std::vector<unsigned> order(n), warp_order(warps);
  for (unsigned t = 0; t < n; ++t) order[t] = t;
  for (unsigned w = 0; w < warps; ++w) warp_order[w] = w;
  schedule_rng rng{(std::uint64_t{by} << 32 | bx) * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull};
  for (;;) {
    bool resumed = false;
    if (rng.next() & 1) {
      rng.shuffle(order.data(), n);
      for (const unsigned t : order) resumed |= resume_if_runnable(threads[t]);
    } else {
      rng.shuffle(warp_order.data(), warps);
      unsigned lanes[32];
      for (const unsigned w : warp_order)
        for (bool again = true; again;) {
          again = false;
          for (unsigned l = 0; l < 32; ++l) lanes[l] = w * 32 + l;
          rng.shuffle(lanes, 32);
          for (const unsigned t : lanes) again |= resume_if_runnable(threads[t]);
          resumed |= again;
        }
    }
    bool left = false;
    for (unsigned t = 0; t < n && !left; ++t) left = !threads[t].finished;
    if (!left) return;
    if (!resumed) deadlock(*current, threads);
  }
}

/// Runs kernel(args...) over the grid, one block at a time, each block's
/// threads as fibers on this thread.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), const launch_config& cfg, const Args&... args) {
  const unsigned block_threads = cfg.threads * cfg.block_y;
  if (block_threads == 0 || block_threads % 32 != 0)
    COROLLA_EMULATION_FAIL("blocks of %u threads: the emulation runs whole warps", block_threads);
  if (running) COROLLA_EMULATION_FAIL("a launch from inside a kernel");
  const auto call = [&] { kernel(args...); };
  using call_type = decltype(call);
  kernel_body = [](const void* c) { (*static_cast<const call_type*>(c))(); };
  kernel_args = &call;
  std::vector<emulated_thread> threads(block_threads);
  for (unsigned by = 0; by < cfg.grid_y; ++by)
    for (unsigned bx = 0; bx < cfg.grid_x; ++bx) {
      std::vector<unsigned char> smem(cfg.smem_bytes + 128, 0xff);  // 0xffffffff: a NaN
      block_state state(block_threads);
      state.smem = smem.data() + (128 - reinterpret_cast<std::uintptr_t>(smem.data()) % 128) % 128;
      state.smem_bytes = cfg.smem_bytes;
      current = &state;
      run_block(threads, cfg, bx, by);
      current = nullptr;
    }
  kernel_body = nullptr;
  kernel_args = nullptr;
}

}  // namespace corolla::emulated

inline void __syncthreads() { corolla::emulated::arrive_and_wait(corolla::emulated::current->block); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) COROLLA_EMULATION_FAIL("__syncwarp with mask %x: only full warps", mask);
  corolla::emulated::arrive_and_wait(corolla::emulated::current->warps[corolla::emulated::linear_thread() >> 5]);
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
  arrive_and_wait(s.warps[w]);
  const T r = static_cast<T>(s.shuffle[w * 32 + (source(lane) & 31u)]);
  arrive_and_wait(s.warps[w]);
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
