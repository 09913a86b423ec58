// tests/kernels/gemm_tuner.cpp — the cuBLASLt algorithm tuner
// (kernels/cuda/gemm_tuner.hpp, lt_matmul.cpp). On the CPU: the rule that
// picks among timed candidates, the totals a benchmark prints and the
// span of a scratch output, the repeats per timed interval. On a GPU: a
// problem's first call times its candidates and records them, later calls
// reuse the choice and count, an accumulating product (beta 1 into c,
// aligned or not) accumulates once however many algorithms were timed, a
// product too small is not timed, and with tuning off nothing is; and
// training's fused products (the residual as C in and out of place,
// GELU_AUX_BIAS, DGELU) and a batch of accumulated weight gradients give
// the cpu's results on their first, timed, calls; a second backend runs
// the algorithm COROLLA_CUDA_GEMM_TUNE_FILE recorded (by its bytes, and by
// its configuration where a byte no attribute reads differs), and a
// recorded algorithm the heuristic no longer names is timed anew. Without
// the CUDA backend or a visible device the GPU test says why in a MESSAGE
// and returns.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/cuda_ops_util.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"
#include "tests/support/tiny_model.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/gemm_tuner.hpp"
#include "kernels/cuda/gemm_tuning_file.hpp"
#endif

using namespace corolla;
using namespace kernel_test;

#ifdef COROLLA_HAVE_CUDA

namespace {
constexpr double none = std::numeric_limits<double>::quiet_NaN();

int choose(std::vector<double> us) { return cuda::gemm_choose_timed(us, 0.03); }

/// Puts the tuning switch back as it was when the test ends, however it ends.
struct restore_tuning {
  bool was = cuda::gemm_tuning_requested();
  ~restore_tuning() { cuda::set_gemm_tuning(was); }
};
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
  c[2].from_file = true;
  const cuda::gemm_tuning_totals t = cuda::gemm_tuning_summary(c);
  CHECK(t.problems == 3);
  CHECK(t.changed == 2);
  CHECK(t.from_file == 1);
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

TEST_CASE("the gemm tuner times enough launches back to back to cover its interval") {
  CHECK(cuda::gemm_tune_repeats(cuda::gemm_tune_min_flops) == 10);
  CHECK(cuda::gemm_tune_repeats(8e9) == 5);
  CHECK(cuda::gemm_tune_repeats(cuda::gemm_tune_interval_flops) == 1);
  CHECK(cuda::gemm_tune_repeats(1e12) == 1);
  CHECK(cuda::gemm_tune_repeats(1e6) == 10);
  CHECK(cuda::gemm_tune_repeats(0) == 10);
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
  const bool timing = !cuda::sync_after_launch();  // every launch a round trip: no timing
  const restore_tuning restore;
  cuda::set_gemm_tuning(true);
  rng r(443);
  // Shapes no other test uses (a problem is timed once per process): a
  // GPT-2-1.5B-like product into c and into a slice of a buffer one f32
  // in (4-byte aligned: the scratch copy must be as aligned), and one too
  // small to time (below gemm_tune_min_flops).
  struct shape {
    std::int64_t m, n, k;
    std::int64_t offset;  ///< c's first element in its buffer
    bool timed;
  };
  for (const shape s : {shape{1024, 1600, 1600, 0, true}, shape{1024, 1600, 1600, 1, true},
                        shape{200, 328, 136, 0, false}}) {
    CAPTURE(s.m);
    CAPTURE(s.offset);
    const Tensor a = rounded(random_tensor({s.m, s.k}, r), dtype::bf16);
    const Tensor b = rounded(random_tensor({s.n, s.k}, r), dtype::bf16);
    const Tensor c0 = random_tensor({s.m, s.n}, r);
    const Tensor da = up(a, dtype::bf16), db = up(b, dtype::bf16);
    Tensor buffer = gpu().empty({s.m * s.n + s.offset}, dtype::f32);
    Tensor dc = buffer.slice(s.offset, s.offset + s.m * s.n).view({s.m, s.n});
    gpu().copy(c0, dc);
    const std::size_t before = cb.gemm_choices().size();
    // c += a b^T, three times: each call accumulates once, the first too
    // (its timed launches write a scratch copy of c).
    for (int i = 0; i < 3; ++i) gpu().gemm(da, false, db, true, dc, 1.0f, 1.0f);
    Tensor want = c0.clone();
    for (int i = 0; i < 3; ++i) cpu().gemm(a, false, b, true, want, 1.0f, 1.0f);
    expect_close(dc, want, red_rtol, 1e-5 * static_cast<double>(s.k), "c after three accumulations");
    const std::vector<cuda::gemm_choice> after = cb.gemm_choices();
    if (!timing || !s.timed) {
      CHECK(after.size() == before);
      continue;
    }
    REQUIRE(after.size() <= before + 1);
    if (after.size() == before && s.offset != 0) {  // 4-byte aligned c: the heuristic may have one algorithm
      MESSAGE("one algorithm for a c at +" << s.offset << ": nothing timed");
      continue;
    }
    REQUIRE(after.size() == before + 1);  // 256-byte aligned, this size has several algorithms on any GPU with bf16
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
    MESSAGE("m=" << s.m << " n=" << s.n << " k=" << s.k << " c at +" << s.offset << ": " << c.candidates
                 << " candidates, chose " << c.chosen << ", " << c.chosen_us << " us against the first's "
                 << c.first_us << " us");
  }

  // With tuning off a new problem keeps the heuristic's first, untimed.
  cuda::set_gemm_tuning(false);
  const Tensor a = rounded(random_tensor({1024, 1536}, r), dtype::bf16);
  const Tensor b = rounded(random_tensor({1536, 1600}, r), dtype::bf16);
  Tensor dc = gpu().empty({1024, 1600}, dtype::f32), want = Tensor::empty({1024, 1600});
  const std::size_t before = cb.gemm_choices().size();
  gpu().gemm(up(a, dtype::bf16), false, up(b, dtype::bf16), false, dc);
  cpu().gemm(a, false, b, false, want);
  expect_close(dc, want, red_rtol, 1e-5 * 1536, "untuned product");
  CHECK(cb.gemm_choices().size() == before);
#endif
}

TEST_CASE("cuda: training's fused and batched products give the cpu's results with their algorithms timed") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  // Sizes above gemm_tune_min_flops (the smaller epilogue tests are not
  // timed), bf16 as mixed precision computes: every call below is a
  // problem's first, so it runs the timed launches before its own.
  const auto& cb = static_cast<const cuda::cuda_backend&>(gpu());
  const restore_tuning restore;
  cuda::set_gemm_tuning(true);
  // Whether the problem of the call just made was timed (a record added).
  std::size_t seen = cb.gemm_choices().size();
  const auto timed_now = [&] {
    const std::size_t now = cb.gemm_choices().size();
    const bool added = now > seen;
    seen = now;
    return added;
  };
  constexpr dtype t = dtype::bf16;
  constexpr std::int64_t rows = 1024, in = 1600, out = 1664;
  constexpr double rtol = 2e-2, atol = 5e-2;
  rng r(449);
  const Tensor x = rounded(random_tensor({rows, in}, r, -0.25f, 0.25f), t);
  const Tensor w = rounded(random_tensor({out, in}, r, -0.25f, 0.25f), t);
  const Tensor bias = rounded(random_tensor({out}, r), t), res = rounded(random_tensor({rows, out}, r), t);
  const Tensor dx = up(x, t), dw = up(w, t), db = up(bias, t);

  // The residual as C, beta 1: out of place, then in place (d is c: the
  // timed launches write a scratch copy).
  Tensor y = Tensor::empty({rows, out});
  cpu().linear(x, w, &bias, y);
  cpu().add(res, y, y);
  Tensor dres = up(res, t), dy = gpu().empty({rows, out}, t);
  REQUIRE(gpu().linear_fused(dx, dw, &db, linear_epilogue::add, &dres, dy));
  expect_close(dy, y, rtol, atol, "linear + add");
  const bool add_timed = timed_now();
  REQUIRE(gpu().linear_fused(dx, dw, &db, linear_epilogue::add, &dres, dres));
  expect_close(dres, y, rtol, atol, "linear + add in place");
  const bool in_place_timed = timed_now();

  // GELU_AUX_BIAS (each timed launch writes the aux matrix), then DGELU
  // reading it.
  Tensor pre = Tensor::empty({rows, out}), act = Tensor::empty({rows, out});
  cpu().linear(x, w, &bias, pre);
  cpu().gelu(pre, act);
  Tensor dpre = gpu().empty({rows, out}, t), dact = gpu().empty({rows, out}, t);
  REQUIRE(gpu().linear_gelu(dx, dw, &db, dpre, dact));
  expect_close(dpre, pre, rtol, atol, "linear_gelu pre");
  expect_close(dact, act, rtol, atol, "linear_gelu y");
  const bool gelu_timed = timed_now();
  const Tensor w2 = rounded(random_tensor({in, out}, r, -0.25f, 0.25f), t);
  const Tensor g = rounded(random_tensor({rows, in}, r, -0.25f, 0.25f), t);
  const Tensor pre_r = rounded(pre, t);
  Tensor prod = Tensor::empty({rows, out}), want = Tensor::empty({rows, out});
  cpu().gemm(g, false, w2, false, prod);
  cpu().gelu_backward(pre_r, prod, want);
  Tensor dgrad = gpu().empty({rows, out}, t);
  REQUIRE(gpu().gemm_gelu_backward(up(g, t), up(w2, t), up(pre_r, t), dgrad));
  expect_close(dgrad, want, rtol, atol, "gemm_gelu_backward");
  const bool dgelu_timed = timed_now();

  // Three weight gradients of one x accumulated as one strided batch
  // (beta 1 into evenly spaced gradients: a batched scratch copy), the
  // weights evenly spaced too, each followed by its bias as in GPT-2.
  const std::int64_t step = out * in + out;
  const Tensor wflat = rounded(random_tensor({3 * step}, r, -0.25f, 0.25f), t), dwflat = up(wflat, t);
  const Tensor grads0 = rounded(random_tensor({3 * step}, r), t);
  const Tensor dstack = rounded(random_tensor({3 * rows, out}, r, -0.25f, 0.25f), t);
  Tensor grads_want = grads0.clone(), dgrads = up(grads0, t), ddstack = up(dstack, t);
  std::vector<Tensor> ws, dys, gw, gb, dws, ddys, dgw, dgb;
  for (std::int64_t i = 0; i < 3; ++i) {
    ws.push_back(wflat.slice(i * step, i * step + out * in).view({out, in}));
    dws.push_back(dwflat.slice(i * step, i * step + out * in).view({out, in}));
    dys.push_back(dstack.slice(i * rows, (i + 1) * rows));
    ddys.push_back(ddstack.slice(i * rows, (i + 1) * rows));
    gw.push_back(grads_want.slice(i * step, i * step + out * in).view({out, in}));
    gb.push_back(grads_want.slice(i * step + out * in, (i + 1) * step));
    dgw.push_back(dgrads.slice(i * step, i * step + out * in).view({out, in}));
    dgb.push_back(dgrads.slice(i * step + out * in, (i + 1) * step));
  }
  Tensor dx_want = Tensor::empty({rows, in}), ddx = gpu().empty({rows, in}, t);
  for (std::int64_t i = 0; i < 3; ++i) {
    cpu().linear_backward(x, ws[i], dys[i], i == 0 ? &dx_want : nullptr, gw[i], &gb[i]);
    if (i > 0) cpu().gemm(dys[i], false, ws[i], false, dx_want, 1.0f, 1.0f);
  }
  const std::vector<const Tensor*> wp = {&dws[0], &dws[1], &dws[2]}, dyp = {&ddys[0], &ddys[1], &ddys[2]};
  const std::vector<Tensor*> gwp = {&dgw[0], &dgw[1], &dgw[2]}, gbp = {&dgb[0], &dgb[1], &dgb[2]};
  const int batched = cb.batched_products();
  const std::size_t before_backward = cb.gemm_choices().size();
  gpu().linear_same_x_backward(dx, wp, dyp, &ddx, gwp, gbp);
  CHECK(cb.batched_products() == batched + 1);
  expect_close(ddx, dx_want, rtol, atol, "dx of three products");
  expect_close(dgrads, grads_want, rtol, atol, "three weight and bias gradients, accumulated");
  const std::vector<cuda::gemm_choice> all = cb.gemm_choices();
  bool batch_timed = false;
  for (std::size_t i = before_backward; i < all.size(); ++i) batch_timed = batch_timed || all[i].batch == 3;

  // Six problems above, each met first here (the three dx products share
  // one). Each may have only one algorithm (nothing to time), so what ran
  // timed is said; the two scratch copies (the add in place, the batch of
  // accumulated gradients) both untimed would leave this test checking
  // nothing of the tuner's own.
  MESSAGE("timed: add " << add_timed << ", add in place " << in_place_timed << ", GELU_AUX_BIAS " << gelu_timed
                        << ", DGELU " << dgelu_timed << ", batched weight gradients " << batch_timed);
  if (!cuda::sync_after_launch()) CHECK((in_place_timed || batch_timed));
#endif
}

TEST_CASE("cuda: cuBLASLt algorithms timed by one backend are read back by the next from COROLLA_CUDA_GEMM_TUNE_FILE") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  if (cuda::sync_after_launch()) {
    MESSAGE("COROLLA_CUDA_SYNC: nothing is timed, nothing written");
    return;
  }
  const restore_tuning restore;
  cuda::set_gemm_tuning(true);
  corolla::testing::temp_dir_guard dir("gemm-tuning-gpu");
  const std::string path = (dir / "choices.tsv").string();
  // Companions read the variable on their first timed problem (the shared
  // instance has long read it): one writes, the next reads.
  struct restore_file {
    const char* v = std::getenv("COROLLA_CUDA_GEMM_TUNE_FILE");
    std::string was = v ? v : "";
    bool set = v != nullptr;
    ~restore_file() {
      if (set)
        setenv("COROLLA_CUDA_GEMM_TUNE_FILE", was.c_str(), 1);
      else
        unsetenv("COROLLA_CUDA_GEMM_TUNE_FILE");
    }
  } restore_file_variable;
  setenv("COROLLA_CUDA_GEMM_TUNE_FILE", path.c_str(), 1);
  rng r(457);
  const Tensor a = rounded(random_tensor({1024, 1600}, r), dtype::bf16);
  const Tensor b = rounded(random_tensor({1728, 1600}, r), dtype::bf16);
  const Tensor da = up(a, dtype::bf16), db = up(b, dtype::bf16);
  gpu().synchronize();  // a companion's stream does not wait for the shared instance's copies
  const auto run = [&](Backend& be, Tensor& y) {
    be.gemm(da, false, db, true, y);
    be.synchronize();
    return static_cast<const cuda::cuda_backend&>(be).gemm_choices();
  };
  std::unique_ptr<Backend> first = gpu().companion(), second = gpu().companion();
  Tensor y1 = first->empty({1024, 1728}, dtype::f32), y2 = second->empty({1024, 1728}, dtype::f32);
  const std::vector<cuda::gemm_choice> timed = run(*first, y1);
  // Aligned operands of this size have several algorithms on any GPU with
  // bf16 (as in the first test): one was timed and written.
  REQUIRE(timed.size() == 1);
  CHECK_FALSE(timed[0].from_file);
  const std::vector<cuda::gemm_choice> read = run(*second, y2);
  REQUIRE(read.size() == 1);
  CHECK(read[0].from_file);
  CHECK(read[0].chosen == timed[0].chosen);
  CHECK(read[0].candidates == timed[0].candidates);
  CHECK(read[0].chosen_us == timed[0].chosen_us);
  CHECK(to_double(y1) == to_double(y2));  // the same algorithm: the same bits

  std::string line;
  {
    std::ifstream in(path);
    REQUIRE(std::getline(in, line));
  }
  // The recorded algorithm with a byte changed that no configuration
  // attribute reads: recognised by its configuration, run untimed, the
  // same bits.
  {
    const std::size_t p_end = line.find('\t'), k_end = line.find('\t', p_end + 1);
    REQUIRE(k_end != std::string::npos);
    const std::string platform = line.substr(0, p_end), problem = line.substr(p_end + 1, k_end - p_end - 1);
    cuda::gemm_tuning_file file(path, platform);
    const std::optional<cuda::gemm_tuning_entry> recorded = file.find(problem);
    REQUIRE(recorded.has_value());
    const auto config = cuda::gemm_algorithm_config(recorded->algo);
    REQUIRE(config.has_value());
    int unread = -1;
    for (int byte = 0; byte < 64 && unread < 0; ++byte) {
      std::array<std::uint64_t, 8> probe = recorded->algo;
      reinterpret_cast<unsigned char*>(probe.data())[byte] ^= 0x5a;
      if (cuda::gemm_algorithm_config(probe) == config) unread = byte;
    }
    if (unread < 0) {
      MESSAGE("every byte of the algorithm is read by its configuration: nothing to change");
    } else {
      cuda::gemm_tuning_entry changed = *recorded;
      reinterpret_cast<unsigned char*>(changed.algo.data())[unread] ^= 0x5a;
      file.add(problem, changed);  // a later line overrides
      std::unique_ptr<Backend> by_config = gpu().companion();
      Tensor yc = by_config->empty({1024, 1728}, dtype::f32);
      const std::vector<cuda::gemm_choice> read_by_config = run(*by_config, yc);
      REQUIRE(read_by_config.size() == 1);
      CHECK(read_by_config[0].from_file);
      CHECK(read_by_config[0].chosen == timed[0].chosen);
      CHECK(to_double(yc) == to_double(y1));
    }
  }

  // A line naming an algorithm the heuristic no longer names (its 64 bytes
  // all ones: neither the bytes nor the configuration of any candidate):
  // the problem is timed anew and a line of it appended.
  const std::size_t tab = line.rfind('\t');
  REQUIRE(tab != std::string::npos);
  REQUIRE(line.size() - tab - 1 == 128);
  std::ofstream(path, std::ios::trunc) << line.substr(0, tab + 1) << std::string(128, 'f') << '\n';
  std::unique_ptr<Backend> third = gpu().companion();
  Tensor y3 = third->empty({1024, 1728}, dtype::f32);
  const std::vector<cuda::gemm_choice> retimed = run(*third, y3);
  REQUIRE(retimed.size() == 1);
  CHECK_FALSE(retimed[0].from_file);
  CHECK(std::isfinite(retimed[0].chosen_us));
  std::ifstream in(path);
  int lines = 0;
  for (std::string l; std::getline(in, l);) ++lines;
  CHECK(lines == 2);
#endif
}
