// Backend::mark, copy_after and host_empty: the cpu's are a null marker,
// copy() and ordinary memory; the CUDA backend's copy runs on a transfer
// stream after the marked work, from another thread if need be, into
// page-locked host memory, and refuses what it cannot do without scratch.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/support/gpu.hpp"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("on the cpu, mark is null, copy_after is a copy and host_empty is host memory") {
  Backend& cpu = cpu_backend();
  CHECK(cpu.mark() == nullptr);
  const Tensor h = cpu.host_empty({2, 3});
  CHECK(h.dev().kind == device_kind::cpu);
  CHECK(h.shape() == shape_t{2, 3});
  rng r(41);
  Tensor a = random_tensor({3, 5}, r), b = Tensor::empty({3, 5});
  cpu.copy_after(nullptr, a, b);
  CHECK(to_double(b) == to_double(a));
}

TEST_CASE("cuda: copy_after sees the work queued before its marker, from another thread too") {
  REQUIRE_GPU_OR_SKIP();
  Backend& gpu = backend_for({device_kind::cuda, 0});
  rng r(42);
  const Tensor host = random_tensor({1000, 257}, r);
  Tensor dev = gpu.empty(host.shape());
  gpu.copy(host, dev);
  gpu.scale(dev, 2.0f);  // queued, maybe still running
  const auto ready = gpu.mark();
  REQUIRE(ready != nullptr);
  Tensor back = gpu.host_empty(host.shape());  // page-locked, as the DP buckets' buffers
  CHECK(back.dev().kind == device_kind::cpu);
  // The download runs on a second thread while this one queues more work
  // on other tensors, as the data-parallel actor does beside the stages.
  std::thread dp([&] { gpu.copy_after(ready.get(), dev, back); });
  Tensor other = gpu.empty({512, 512});
  for (int i = 0; i < 20; ++i) gpu.gemm(dev.slice(0, 512).view({512, 257}), false,
                                        dev.slice(0, 512).view({512, 257}), true, other);
  dp.join();
  std::vector<double> want = to_double(host);
  for (double& x : want) x *= 2.0;
  CHECK(to_double(back) == want);

  // Up again, then read back in stream order. A fresh block may still be in
  // use by queued ops (the allocator orders by the main stream): mark first.
  Tensor up = gpu.empty(host.shape()), check = Tensor::empty(host.shape());
  gpu.copy_after(gpu.mark().get(), host, up);
  gpu.copy(up, check);
  CHECK(to_double(check) == to_double(host));
}

TEST_CASE("cuda: copy_after refuses conversions and markers of another backend") {
  REQUIRE_GPU_OR_SKIP();
  Backend& gpu = backend_for({device_kind::cuda, 0});
  Tensor dev = gpu.empty({4}), half = Tensor::empty({4}, dtype::bf16), host = Tensor::zeros({4});
  CHECK_THROWS_WITH_AS(gpu.copy_after(nullptr, dev, half), doctest::Contains("copy_after: [4] f32 into [4] bf16"),
                       tensor_error);
  struct foreign final : queue_marker {};
  foreign m;
  CHECK_THROWS_WITH_AS(gpu.copy_after(&m, host, dev), doctest::Contains("the marker is not one of cuda:0's"),
                       tensor_error);
}
