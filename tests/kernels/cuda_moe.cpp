// tests/kernels/cuda_moe.cpp — the CUDA backend's mixture-of-experts row
// moves (moe_gather, moe_combine, moe_combine_weight_grad) against the CPU
// backend, with indices on the host (as the router passes them) and on the
// device. Skipped without a GPU; the same kernels run on the CPU under the
// CUDA emulation in tests/cuda_emulated/moe_kernels.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("cuda: moe row moves match the cpu with indices on the host or the device") {
  REQUIRE_GPU_OR_SKIP();
  rng r(211);
  const std::int64_t n = 7, k = 2, d = 300, m = n * k;
  Tensor src = random_tensor({n, d}, r);
  std::vector<std::int32_t> rows_v, slots_v;
  for (std::int64_t i = 0; i < m; ++i) rows_v.push_back(static_cast<std::int32_t>((i * 5) % n));
  for (std::int64_t i = 0; i < m; ++i) slots_v.push_back(static_cast<std::int32_t>((i * 3) % m));
  const Tensor rows = ids_tensor(rows_v);
  const Tensor slots = ids_tensor(slots_v).view({n, k});
  Tensor w_rows = random_tensor({m}, r), w_slots = random_tensor({n, k}, r);
  for (bool on_device : {false, true}) {
    CAPTURE(on_device);
    const Tensor the_rows = on_device ? up(rows) : rows;
    const Tensor the_slots = on_device ? up(slots) : slots;
    for (bool weighted : {false, true}) {
      CAPTURE(weighted);
      Tensor want = Tensor::empty({m, d});
      cpu().moe_gather(src, rows, weighted ? &w_rows : nullptr, want);
      Tensor got = gpu().empty({m, d});
      const Tensor dw = up(w_rows);
      gpu().moe_gather(up(src), the_rows, weighted ? &dw : nullptr, got);
      expect_close(got, want, ew_rtol, ew_atol, "moe_gather");
      // Combine back, overwriting and accumulating.
      for (bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        Tensor start = random_tensor({n, d}, r);
        Tensor back = start.clone();
        cpu().moe_combine(want, slots, weighted ? &w_slots : nullptr, accumulate, back);
        Tensor dback = up(start);
        const Tensor dws = up(w_slots);
        gpu().moe_combine(up(want), the_slots, weighted ? &dws : nullptr, accumulate, dback);
        expect_close(dback, back, red_rtol, red_atol, "moe_combine");
      }
    }
    Tensor dy = random_tensor({n, d}, r), ys = random_tensor({m, d}, r);
    Tensor want = Tensor::empty({n, k});
    cpu().moe_combine_weight_grad(dy, ys, slots, want);
    Tensor got = gpu().empty({n, k});
    gpu().moe_combine_weight_grad(up(dy), up(ys), the_slots, got);
    expect_close(got, want, red_rtol, red_atol, "moe_combine_weight_grad");
  }
  // An index out of range is refused before any launch.
  std::vector<std::int32_t> bad = rows_v;
  bad[3] = static_cast<std::int32_t>(n);
  Tensor out = gpu().empty({m, d});
  CHECK(error_of([&] { gpu().moe_gather(up(src), ids_tensor(bad), nullptr, out); }).find("outside") != std::string::npos);
}
