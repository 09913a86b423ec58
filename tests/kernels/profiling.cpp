// kernels/profiling_backend.hpp: forwarding is exact, timing only while
// enabled, one row per op name with its calls.
#include <doctest/doctest.h>

#include "kernel_test_util.hpp"
#include "kernels/profiling_backend.hpp"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("the profiling backend forwards every op unchanged and times only while enabled") {
  Backend& cpu = cpu_backend();
  profiling_backend prof(cpu);
  CHECK(prof.name() == cpu.name());
  CHECK(prof.dev() == cpu.dev());
  rng r(7);
  Tensor x = random_tensor({5, 8}, r), w = random_tensor({3, 8}, r), b = random_tensor({3}, r);
  Tensor want = Tensor::empty({5, 3}), got = prof.empty({5, 3});
  cpu.linear(x, w, &b, want);
  prof.linear(x, w, &b, got);
  CHECK(to_double(got) == to_double(want));
  CHECK(prof.totals().empty());  // disabled: forwarded, not timed

  prof.enable(true);
  prof.linear(x, w, &b, got);
  prof.linear(x, w, &b, got);
  Tensor sum = Tensor::empty({5, 8}), y = Tensor::empty({5, 8}), n = random_tensor({8}, r);
  prof.add_rmsnorm(x, x, sum, n, 1e-5f, y);  // a fused op keeps its own name
  CHECK(prof.sum_squares(x) == doctest::Approx(cpu.sum_squares(x)));
  prof.enable(false);
  prof.linear(x, w, &b, got);
  const auto t = prof.totals();
  REQUIRE(t.size() == 3);
  for (const auto& row : t) {
    CAPTURE(row.op);
    CHECK(row.seconds >= 0.0);
    CHECK(row.calls == (row.op == "linear" ? 2 : 1));
  }
  for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i - 1].seconds >= t[i].seconds);
  prof.reset();
  CHECK(prof.totals().empty());
}
