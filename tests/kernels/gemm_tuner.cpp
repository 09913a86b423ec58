// tests/kernels/gemm_tuner.cpp — the cuBLASLt algorithm tuner
// (kernels/cuda/gemm_tuner.hpp, lt_matmul.cpp). On the CPU: the rule that
// picks among timed candidates, the totals a benchmark prints and the
// span of a scratch output. On a GPU: a problem's first call times its
// candidates and records them, later calls reuse the choice and count,
// an accumulating product (beta 1 into c) accumulates once however many
// algorithms were timed, and with tuning off nothing is timed. Without
// the CUDA backend or a visible device the GPU test says why in a MESSAGE
// and returns.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/gemm_tuner.hpp"
#endif

using namespace corolla;
using namespace kernel_test;

#ifdef COROLLA_HAVE_CUDA

namespace {
constexpr double none = std::numeric_limits<double>::quiet_NaN();

int choose(std::vector<double> us) { return cuda::gemm_choose_timed(us, 0.03); }
}  // namespace

TEST_CASE("the gemm tuner keeps the heuristic's first unless another is clearly faster") {
  CHECK(choose({}) == 0);
  CHECK(choose({10.0}) == 0);
  CHECK(choose({10.0, 9.8}) == 0);        // 2 % faster: noise, the first stays
  CHECK(choose({10.0, 9.0, 9.5}) == 1);   // 10 % faster
  CHECK(choose({10.0, 9.0, 9.0}) == 1);   // a tie keeps the lower index
  CHECK(choose({10.0, 11.0, 12.0}) == 0);
  CHECK(choose({10.0, none, 5.0}) == 2);   // a candidate that refused is skipped
  CHECK(choose({none, 12.0, 11.0}) == 2);  // the first refused: the fastest that ran
  CHECK(choose({none, none}) == 0);         // none ran: the first (its own launch decides)
  CHECK(cuda::gemm_choose_timed(std::vector<double>{10.0, 9.5}, 0.0) == 1);
  CHECK(cuda::gemm_choose_timed(std::vector<double>{10.0, 9.5}, 0.1) == 0);
}

TEST_CASE("the gemm tuner's totals weigh each problem by its calls") {
  std::vector<cuda::gemm_choice> c(3);
  c[0].chosen = 0, c[0].first_us = 10, c[0].chosen_us = 10, c[0].calls = 4;  // kept the first
  c[1].chosen = 2, c[1].first_us = 30, c[1].chosen_us = 20, c[1].calls = 2;  // changed
  c[2].chosen = 1, c[2].first_us = none, c[2].chosen_us = 5, c[2].calls = 1;  // the first refused
  const cuda::gemm_tuning_totals t = cuda::gemm_tuning_summary(c);
  CHECK(t.problems == 3);
  CHECK(t.changed == 2);
  CHECK(t.first_us == doctest::Approx(4 * 10 + 2 * 30 + 1 * 5));
  CHECK(t.chosen_us == doctest::Approx(4 * 10 + 2 * 20 + 1 * 5));
  CHECK(t.speedup() == doctest::Approx(105.0 / 85.0));
  CHECK(cuda::gemm_tuning_summary({}).speedup() == 1.0);
}

TEST_CASE("a scratch copy of a cuBLASLt output spans its rows and its batch") {
  CHECK(cuda::lt_output_span(4, 3, 5, 1, 0) == 3 * 5 + 3);
  CHECK(cuda::lt_output_span(4, 3, 3, 1, 0) == 12);
  CHECK(cuda::lt_output_span(4, 3, 5, 3, 100) == 3 * 5 + 3 + 2 * 100);
  CHECK(cuda::lt_output_span(0, 3, 5, 1, 0) == 0);
  CHECK_THROWS_AS(cuda::lt_output_span(4, 3, 2, 1, 0), std::invalid_argument);
}

TEST_CASE("the gemm tuner's switch") {
  const bool was = cuda::gemm_tuning_requested();
  cuda::set_gemm_tuning(!was);
  CHECK(cuda::gemm_tuning_requested() == !was);
  cuda::set_gemm_tuning(was);
  CHECK(cuda::gemm_tuning_requested() == was);
}

#endif  // COROLLA_HAVE_CUDA

TEST_CASE("cuda: cuBLASLt algorithms are timed on a problem's first call, reused after, accumulate once") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  const auto& cb = static_cast<const cuda::cuda_backend&>(gpu());
  const char* sync = std::getenv("COROLLA_CUDA_SYNC");
  const bool timing = sync == nullptr || std::strcmp(sync, "0") == 0;  // every launch a round trip: no timing
  const bool was = cuda::gemm_tuning_requested();
  cuda::set_gemm_tuning(true);
  rng r(443);
  std::size_t timed = 0;
  // Shapes no other test uses (a problem is timed once per process): a
  // GPT-2-1.5B-like product, and a small one with odd sides.
  struct shape {
    std::int64_t m, n, k;
  };
  for (const shape s : {shape{1024, 1600, 1600}, shape{200, 328, 136}}) {
    CAPTURE(s.m);
    const Tensor a = rounded(random_tensor({s.m, s.k}, r), dtype::bf16);
    const Tensor b = rounded(random_tensor({s.n, s.k}, r), dtype::bf16);
    const Tensor c0 = random_tensor({s.m, s.n}, r);
    const Tensor da = up(a, dtype::bf16), db = up(b, dtype::bf16);
    Tensor dc = up(c0, dtype::f32);
    const std::size_t before = cb.gemm_choices().size();
    // c += a b^T, three times: each call accumulates once, the first too
    // (its timed launches write a scratch copy of c).
    for (int i = 0; i < 3; ++i) gpu().gemm(da, false, db, true, dc, 1.0f, 1.0f);
    Tensor want = c0.clone();
    for (int i = 0; i < 3; ++i) cpu().gemm(a, false, b, true, want, 1.0f, 1.0f);
    expect_close(dc, want, red_rtol, 1e-5 * static_cast<double>(s.k), "c after three accumulations");
    const std::vector<cuda::gemm_choice> after = cb.gemm_choices();
    if (!timing) {
      CHECK(after.size() == before);
      continue;
    }
    REQUIRE(after.size() <= before + 1);
    if (after.size() == before) {
      MESSAGE("the heuristic named one algorithm for m=" << s.m << ": nothing to time");
      continue;
    }
    ++timed;
    const cuda::gemm_choice& c = after.back();
    CHECK(c.m == s.m);
    CHECK(c.n == s.n);
    CHECK(c.k == s.k);
    CHECK(c.what == "bf16 x bf16 -> f32, b^T");
    CHECK(c.candidates > 1);
    CHECK(c.candidates <= cuda::gemm_tune_candidates);
    CHECK(c.chosen >= 0);
    CHECK(c.chosen < c.candidates);
    CHECK(c.calls == 3);
    REQUIRE(std::isfinite(c.chosen_us));
    CHECK(c.chosen_us > 0);
    if (std::isfinite(c.first_us)) CHECK(c.chosen_us <= c.first_us);
    MESSAGE("m=" << s.m << " n=" << s.n << " k=" << s.k << ": " << c.candidates << " candidates, chose "
                 << c.chosen << ", " << c.chosen_us << " us against the first's " << c.first_us << " us");
  }
  if (timing) CHECK(timed >= 1);  // the 1024 x 1600 x 1600 product has several algorithms on any GPU with bf16

  // With tuning off a new problem keeps the heuristic's first, untimed.
  cuda::set_gemm_tuning(false);
  const Tensor a = rounded(random_tensor({96, 72}, r), dtype::bf16), b = rounded(random_tensor({72, 40}, r), dtype::bf16);
  Tensor dc = gpu().empty({96, 40}, dtype::f32), want = Tensor::empty({96, 40});
  const std::size_t before = cb.gemm_choices().size();
  gpu().gemm(up(a, dtype::bf16), false, up(b, dtype::bf16), false, dc);
  cpu().gemm(a, false, b, false, want);
  expect_close(dc, want, red_rtol, red_atol, "untuned product");
  CHECK(cb.gemm_choices().size() == before);
  cuda::set_gemm_tuning(was);
#endif
}
