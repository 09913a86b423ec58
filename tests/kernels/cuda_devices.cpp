// tests/kernels/cuda_devices.cpp — device tensors and errors of the CUDA
// backend: dtype conversions on copy, the memory hooks, running out of
// memory, ops refusing wrong or host tensors, and a one-rank NCCL group
// against the CPU reference; device names, device requests without a
// visible device and host-only operations on device tensors run everywhere
// (the GPU tests say why in a MESSAGE and return without a device).
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "tests/support/gpu.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/allocator.hpp"
#include "kernels/cuda/device.hpp"
#endif

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

// ---- transfers, tensors, memory, errors ------------------------------------------------

TEST_CASE("cuda: copy converts on the device exactly like the host conversion") {
  REQUIRE_GPU_OR_SKIP();
  rng r(115);
  Tensor x = random_tensor({777}, r, -1e4f, 1e4f);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(t));
    Tensor d16 = up(x, t);  // H2D with conversion
    CHECK(same_values(down(d16), x.to(t)));
    Tensor h32 = Tensor::empty({777});
    gpu().copy(d16, h32);  // D2H with conversion
    CHECK(same_values(h32, x.to(t).to(dtype::f32)));
    Tensor d32 = gpu().empty({777});
    gpu().copy(d16, d32);  // D2D with conversion
    CHECK(same_values(down(d32), h32));
  }
  const std::vector<std::int32_t> iv{1, -2, 3};
  Tensor di = up(ids_tensor(iv));
  CHECK(same_values(down(di), ids_tensor(iv)));
  Tensor df = gpu().empty({3});
  CHECK_THROWS_AS(gpu().copy(di, df), tensor_error);  // i32 -> f32 is not a copy
}

TEST_CASE("cuda: device tensors zero, clone, copy_from and to_vector through the hooks") {
  REQUIRE_GPU_OR_SKIP();
  rng r(116);
  Tensor h = random_tensor({4, 9}, r);
  Tensor d = up(h);
  CHECK(d.dev() == device{device_kind::cuda, 0});
  Tensor c = d.clone();
  CHECK(c.dev() == d.dev());
  CHECK(c.raw() != d.raw());
  CHECK(c.to_vector() == h.to_vector());
  Tensor e = Tensor::empty({4, 9}, dtype::f32, {device_kind::cuda, 0});
  e.copy_from(h);  // H2D
  CHECK(e.to_vector() == h.to_vector());
  Tensor back = Tensor::empty({4, 9});
  back.copy_from(e);  // D2H
  CHECK(same_values(back, h));
  e.slice(1, 3).zero();
  std::vector<float> want = h.to_vector();
  for (int i = 9; i < 27; ++i) want[i] = 0.0f;
  CHECK(e.to_vector() == want);
  CHECK_THROWS_AS(e.to(dtype::bf16), tensor_error);  // host-only conversion
  CHECK(gpu().name() == "cuda:0");
  CHECK(&gpu() == &backend_for({device_kind::cuda, 0}));
}

TEST_CASE("cuda: an impossible allocation says out of memory and the allocator keeps working") {
  REQUIRE_GPU_OR_SKIP();
  const std::string msg =
      error_of([] { Tensor::empty({std::int64_t{1} << 42}, dtype::f32, {device_kind::cuda, 0}); });
  CHECK_MESSAGE(msg.find("out of memory") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("cuda:0") != std::string::npos, msg);
  Tensor ok = gpu().empty({1024});
  ok.zero();
  CHECK(gpu().sum_squares(ok) == 0.0);
#ifdef COROLLA_HAVE_CUDA
  // A released block is reused for the next request of its size class.
  const auto before = cuda::stats(0);
  { Tensor t = gpu().empty({12345}); }
  { Tensor t = gpu().empty({12345}); }
  CHECK(cuda::stats(0).device_mallocs <= before.device_mallocs + 1);
#endif
}

TEST_CASE("cuda: ops reject wrong shapes, dtypes and host tensors with tensor_error") {
  REQUIRE_GPU_OR_SKIP();
  rng r(117);
  Tensor x = up(random_tensor({3, 8}, r)), w = up(random_tensor({4, 8}, r));
  Tensor y_wrong = gpu().empty({3, 5});
  CHECK_THROWS_AS(gpu().linear(x, w, nullptr, y_wrong), tensor_error);
  Tensor c = gpu().empty({3, 3});
  CHECK_THROWS_WITH_AS(gpu().gemm(x, false, w, false, c), doctest::Contains("gemm"),
                       tensor_error);
  Tensor host_x = random_tensor({3, 8}, r);
  Tensor y = gpu().empty({3, 4});
  CHECK_THROWS_WITH_AS(gpu().linear(host_x, w, nullptr, y), doctest::Contains("cuda:0"),
                       tensor_error);
  // f32 x takes an f32 or a bf16 (inference) weight, nothing else
  Tensor w16 = up(random_tensor({4, 8}, r), dtype::f16);
  CHECK_THROWS_WITH_AS(gpu().linear(x, w16, nullptr, y), doctest::Contains("f32 or bf16 weight"),
                       tensor_error);
  Tensor rn = gpu().empty({3, 8});
  CHECK_THROWS_AS(gpu().rmsnorm(x, up(random_tensor({7}, r)), 1e-5f, rn, nullptr), tensor_error);
  // 16-bit activations keep one dtype; the weight stays f32
  Tensor rn16 = gpu().empty({3, 8}, dtype::bf16);
  CHECK_THROWS_WITH_AS(gpu().rmsnorm(x, up(random_tensor({8}, r)), 1e-5f, rn16, nullptr),
                       doctest::Contains("rmsnorm y"), tensor_error);
  CHECK_THROWS_WITH_AS(gpu().rmsnorm(up(random_tensor({3, 8}, r), dtype::bf16), up(random_tensor({8}, r), dtype::bf16),
                                     1e-5f, rn16, nullptr),
                       doctest::Contains("rmsnorm w"), tensor_error);
  CHECK_THROWS_AS(gpu().add(x, gpu().empty({8, 3}), rn), tensor_error);
  Tensor xi = gpu().empty({3, 8}, dtype::i32);
  CHECK_THROWS_AS(gpu().gelu(xi, xi), tensor_error);
  // the CPU backend refuses device tensors
  Tensor hy = Tensor::empty({3, 8});
  CHECK_THROWS_WITH_AS(cpu().gelu(x, hy), doctest::Contains("cuda:0"), tensor_error);
}

// ---- without a GPU -------------------------------------------------------------------------

TEST_CASE("device names parse, auto is cuda:0 with a visible GPU and the cpu without") {
  CHECK(parse_device("cpu").kind == device_kind::cpu);
  CHECK(parse_device("cuda").kind == device_kind::cuda);
  CHECK(parse_device("cuda:3").index == 3);
  const device a = parse_device("auto");
  if (cuda_device_count() > 0) {
    CHECK(a.kind == device_kind::cuda);
    CHECK(a.index == 0);
  } else {
    CHECK(a.kind == device_kind::cpu);
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""})
    CHECK_THROWS_WITH_AS(parse_device(bad), doctest::Contains("expected auto, cpu, cuda or cuda:N"),
                         std::invalid_argument);
}

TEST_CASE("cuda device requests without a visible device fail with the reason") {
  if (cuda_device_count() > 0) {
    MESSAGE("skipped: a CUDA device is visible (the GPU tests cover the working path)");
    return;
  }
  const std::string msg = error_of([] { backend_for({device_kind::cuda, 0}); });
  CHECK_MESSAGE(!msg.empty(), "backend_for(cuda:0) did not throw");
#ifdef COROLLA_HAVE_CUDA
  CHECK_MESSAGE(msg.find("no CUDA device is visible") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find(cuda::device_count_error()) != std::string::npos, msg);
  const std::string alloc =
      error_of([] { Tensor::empty({4}, dtype::f32, {device_kind::cuda, 0}); });
  CHECK_MESSAGE(alloc.find("no CUDA device is visible") != std::string::npos, alloc);
#else
  CHECK_MESSAGE(msg.find("built without CUDA") != std::string::npos, msg);
  CHECK_THROWS_WITH_AS(Tensor::empty({4}, dtype::f32, {device_kind::cuda, 0}),
                       doctest::Contains("no memory allocator is registered"), tensor_error);
#endif
}

TEST_CASE("tensors on a device refuse host-only operations instead of touching the bytes") {
  // A "device" tensor over host bytes: nothing below may read or write them
  // as host memory (storage::borrow needs no GPU).
  std::vector<float> bytes(8, 1.5f);
  auto st = storage::borrow(bytes.data(), bytes.size() * sizeof(float), nullptr,
                            {device_kind::cuda, 0});
  Tensor t = Tensor::wrap(st, 0, {8}, dtype::f32);
  CHECK_THROWS_WITH_AS(t.to(dtype::bf16), doctest::Contains("host tensors only"), tensor_error);
  CHECK_THROWS_WITH_AS(cpu_backend().scale(t, 2.0f), doctest::Contains("cuda:0"), tensor_error);
  Tensor host = Tensor::empty({8});
  CHECK_THROWS_WITH_AS(cpu_backend().copy(t, host), doctest::Contains("cuda:0"), tensor_error);
  if (cuda_device_count() == 0) {
    // Without a device the hooks fail loudly (no CUDA backend: no allocator
    // registered; CUDA backend: the runtime reports no device).
    CHECK_THROWS(t.zero());
    CHECK_THROWS(t.clone());
    CHECK_THROWS(t.to_vector());
    CHECK_THROWS(host.copy_from(t));
    CHECK(bytes == std::vector<float>(8, 1.5f));
  }
}

// ---- NCCL --------------------------------------------------------------------------------

#ifdef COROLLA_HAVE_NCCL
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/nccl_comm.hpp"

TEST_CASE("cuda: a one-rank NCCL group's collectives return their input") {
  REQUIRE_GPU_OR_SKIP();
  rng r(118);
  auto& be = static_cast<cuda::cuda_backend&>(gpu());
  CHECK(be.has_device_groups());
  std::unique_ptr<device_group> joined = be.join_group(be.new_group_id(), 0, 1, {});
  auto& group = dynamic_cast<cuda::nccl_group&>(*joined);
  CHECK(group.size() == 1);
  Tensor x = random_tensor({100}, r);
  Tensor dx = up(x), out = gpu().empty({100});
  group.all_reduce(be, dx, out);
  group.all_reduce(be, out, out);  // in place
  Tensor gathered = gpu().empty({100}), scattered = gpu().empty({100});
  group.all_gather(be, out, gathered);
  // On a companion's stream (the DP group's thread queues them there),
  // which is not ordered after be's: wait for the gather first.
  be.synchronize();
  std::unique_ptr<Backend> side = be.companion();
  group.reduce_scatter(*side, gathered, scattered);
  side->synchronize();
  CHECK(same_values(down(scattered), x));
  Tensor wrong = gpu().empty({99});
  CHECK_THROWS_AS(group.all_reduce(be, dx, wrong), tensor_error);
  CHECK_THROWS_WITH_AS(group.all_gather(cpu_backend(), dx, gathered), doctest::Contains("not cpu"), tensor_error);
  group.synchronize(be);  // nothing pending: returns at once
}
#endif
