// tests/cuda_emulated/emulation.cpp — the emulation itself
// (cuda_emulation.hpp), on kernels written here: a block's threads run as
// fibers in shuffled orders, so a thread that reads another's write
// without the barrier between them reads the shared memory's NaN in some
// pass, a warp that runs ahead overwrites what another warp has not read
// yet when no barrier holds it back, and the same launch repeats bit for
// bit; barriers and shuffles work in blocks of up to 1024 threads and in
// 2-D blocks; a barrier some threads never reach aborts, counting who
// waits where, instead of hanging (run in a forked child).
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"

using namespace corolla;

namespace {

/// Each thread writes its index to shared memory and reads its right
/// neighbour's (the next warp's first lane for a warp's last): with Sync,
/// after a __syncthreads.
template <bool Sync>
__global__ void neighbour_kernel(float* out) {
  COROLLA_BLOCK_SMEM(smem);
  auto* s = reinterpret_cast<float*>(smem);
  const unsigned t = emulated::linear_thread(), n = blockDim.x * blockDim.y;
  s[t] = static_cast<float>(t);
  if constexpr (Sync) __syncthreads();
  out[blockIdx.x * n + t] = s[(t + 1) % n];
}

/// The same within each warp: lane l reads lane l + 1's write, with Sync
/// after a __syncwarp.
template <bool Sync>
__global__ void warp_neighbour_kernel(float* out) {
  COROLLA_BLOCK_SMEM(smem);
  auto* s = reinterpret_cast<float*>(smem);
  const unsigned t = emulated::linear_thread(), base = t & ~31u;
  s[t] = static_cast<float>(t);
  if constexpr (Sync) __syncwarp();
  out[t] = s[base + ((t + 1) & 31u)];
}

/// Four tiles through one shared buffer: each thread writes its element of
/// tile k, and after a __syncthreads adds the element of the thread 32 on
/// (another warp's). With Sync, a __syncthreads before each tile's writes
/// keeps them off the previous tile's readers.
template <bool Sync>
__global__ void tiles_kernel(float* out) {
  COROLLA_BLOCK_SMEM(smem);
  auto* s = reinterpret_cast<float*>(smem);
  const unsigned t = emulated::linear_thread(), n = blockDim.x;
  float acc = 0.0f;
  for (unsigned k = 0; k < 4; ++k) {
    if constexpr (Sync) __syncthreads();
    s[t] = static_cast<float>(k * n + t);
    __syncthreads();
    acc += s[(t + 32) % n];
  }
  out[t] = acc;
}

/// A block sum: every warp reduces with shuffles, warp 0 adds the warps'.
__global__ void block_sum_kernel(const float* in, float* out) {
  COROLLA_BLOCK_SMEM(smem);
  auto* partial = reinterpret_cast<float*>(smem);
  const unsigned t = emulated::linear_thread(), n = blockDim.x * blockDim.y;
  float v = in[t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((t & 31u) == 0) partial[t >> 5] = v;
  __syncthreads();
  if (t < 32) {
    float w = t < n / 32 ? partial[t] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (t == 0) *out = w;
  }
}

/// Thread 0 returns early; the others wait for it at a __syncthreads.
__global__ void early_return_kernel(float* out) {
  if (emulated::linear_thread() == 0) return;
  __syncthreads();
  out[emulated::linear_thread()] = 1.0f;
}

/// Half of warp 0 waits at a __syncwarp, every other thread at a
/// __syncthreads.
__global__ void split_barriers_kernel(float* out) {
  if (emulated::linear_thread() < 16)
    __syncwarp();
  else
    __syncthreads();
  out[emulated::linear_thread()] = 1.0f;
}

std::vector<float> run_neighbours(void (*kernel)(float*), unsigned threads, unsigned blocks, unsigned block_y = 1) {
  std::vector<float> out(static_cast<std::size_t>(threads) * block_y * blocks, -1.0f);
  emulated::launch(kernel, {blocks, 1, threads, std::size_t{threads} * block_y * sizeof(float), block_y}, out.data());
  return out;
}

int nan_count(const std::vector<float>& v) {
  int n = 0;
  for (float x : v) n += std::isnan(x);
  return n;
}

/// How a forked child running `kernel` on one block of 64 threads (and a
/// float of shared memory each) ended: the signal that ended it (0 when it
/// exited), its exit status, and what it wrote to stderr. The child has a
/// minute before SIGALRM ends it, and writes no core file.
struct child_end {
  int signal = 0, status = -1;
  std::string err;
};
child_end run_in_child(void (*kernel)(float*)) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child dies by the signal, unreported: doctest's handlers are the parent's.
    for (const int sig : {SIGABRT, SIGSEGV, SIGALRM, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, SIG_DFL);
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    dup2(pipe_fds[1], STDERR_FILENO);
    if (FILE* null = std::freopen("/dev/null", "w", stdout); !null) _exit(2);
    close(pipe_fds[0]);
    alarm(60);
    std::vector<float> out(64);
    emulated::launch(kernel, {1, 1, 64, 64 * sizeof(float)}, out.data());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string err;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return {WIFSIGNALED(status) ? WTERMSIG(status) : 0, WIFEXITED(status) ? WEXITSTATUS(status) : -1, err};
}

}  // namespace

TEST_CASE("emulation: a read of another thread's write before the barrier that orders them reads NaN in some order") {
  SUBCASE("block") {
    const std::vector<float> synced = run_neighbours(&neighbour_kernel<true>, 128, 3);
    for (unsigned b = 0; b < 3; ++b)
      for (unsigned t = 0; t < 128; ++t) REQUIRE(synced[b * 128 + t] == static_cast<float>((t + 1) % 128));
    const std::vector<float> racy = run_neighbours(&neighbour_kernel<false>, 128, 3);
    // Each thread reads a neighbour that ran before it (its value) or not
    // yet (NaN): about half of each.
    CHECK(nan_count(racy) > 3 * 128 / 8);
    CHECK(nan_count(racy) < 3 * 128 * 7 / 8);
    // The order is seeded by the block: a run repeats.
    const std::vector<float> again = run_neighbours(&neighbour_kernel<false>, 128, 3);
    CHECK(std::memcmp(racy.data(), again.data(), racy.size() * sizeof(float)) == 0);
  }
  SUBCASE("warp") {
    const std::vector<float> synced = run_neighbours(&warp_neighbour_kernel<true>, 64, 1);
    for (unsigned t = 0; t < 64; ++t) REQUIRE(synced[t] == static_cast<float>((t & ~31u) + ((t + 1) & 31u)));
    CHECK(nan_count(run_neighbours(&warp_neighbour_kernel<false>, 64, 1)) > 4);
  }
  SUBCASE("a warp overwriting what another still reads") {
    const auto tiles = [](void (*kernel)(float*)) {
      std::vector<float> out(128, NAN);
      emulated::launch(kernel, {1, 1, 128, 128 * sizeof(float)}, out.data());
      int wrong = 0;
      for (unsigned t = 0; t < 128; ++t) wrong += out[t] != static_cast<float>(4 * ((t + 32) % 128) + 128 * 6);
      return wrong;
    };
    CHECK(tiles(&tiles_kernel<true>) == 0);
    CHECK(tiles(&tiles_kernel<false>) > 0);
  }
  SUBCASE("2-D blocks of 1024 threads") {
    const std::vector<float> synced = run_neighbours(&neighbour_kernel<true>, 32, 2, 32);
    for (unsigned b = 0; b < 2; ++b)
      for (unsigned t = 0; t < 1024; ++t) REQUIRE(synced[b * 1024 + t] == static_cast<float>((t + 1) % 1024));
    CHECK(nan_count(run_neighbours(&neighbour_kernel<false>, 32, 2, 32)) > 2 * 1024 / 8);
  }
}

TEST_CASE("emulation: shuffles and barriers sum a block of up to 1024 threads") {
  for (const unsigned threads : {32u, 96u, 1024u}) {
    CAPTURE(threads);
    std::vector<float> in(threads);
    double want = 0;
    for (unsigned i = 0; i < threads; ++i) want += in[i] = static_cast<float>(i % 7) - 2.5f;
    float got = NAN;
    emulated::launch(&block_sum_kernel, {1, 1, threads, 32 * sizeof(float)}, in.data(), &got);
    CHECK(got == doctest::Approx(want));
  }
}

TEST_CASE("emulation: a barrier some threads never reach aborts, naming what waits, instead of hanging") {
  const child_end early = run_in_child(&early_return_kernel);
  CHECK(early.signal == SIGABRT);
  CHECK(early.err.find("block (0, 0) of 64 threads cannot go on: 63 wait at __syncthreads, 0 at a warp barrier") !=
        std::string::npos);
  CHECK(early.err.find("1 returned") != std::string::npos);
  const child_end split = run_in_child(&split_barriers_kernel);
  CHECK(split.signal == SIGABRT);
  CHECK(split.err.find("48 wait at __syncthreads, 16 at a warp barrier") != std::string::npos);
  // and a block whose barriers every thread reaches ends normally
  const child_end fine = run_in_child(&neighbour_kernel<true>);
  CHECK(fine.signal == 0);
  CHECK(fine.status == 0);
}
