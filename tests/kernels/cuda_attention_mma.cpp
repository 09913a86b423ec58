// tests/kernels/cuda_attention_mma.cpp — training attention on the tensor
// cores (kernels/cuda/attention_mma.cu, taken at bf16 matmul precision)
// against the CPU's f32 attention.
//
// Tolerance: q, k, v, dout, P and dS are rounded to bf16 (relative 2^-8)
// before each product, sums stay f32. With inputs in [-1, 1] every result
// is checked against a normwise bound, |got - want| <= 3e-2 * M, M = max
// |want| of the tensor (for dq, dk and dv at least a quarter of the largest
// gradient: dq and dk vanish exactly with a single key while their bf16
// residue does not; lse within 3e-2 absolute, M = 1: a few rounding errors
// of the scores it is the log-sum of), while the typical error must stay far
// below that (mean error <= 4e-3 * M). tests/cuda_emulated/ runs the same
// kernels on the CPU under an emulation with the same bound. The f32 kernels would pass too, so
// each case also checks that the result moved away from the f32 one: the
// tensor cores ran. bf16 tensors take the same kernels at any precision and
// must give the f32 tensors' forward rounded once; f16 tensors take them
// with f16 tiles and must land closer to the cpu than bf16. Both kernel
// families (the register kernels and the WMMA ones, chosen by
// COROLLA_ATTENTION_KERNELS) run every case.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "tests/support/gpu.hpp"
#include "kernels/backend.hpp"
#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/attention_mma.hpp"
#include "kernels/cuda/attention_tiled.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#endif

using namespace corolla;
using namespace kernel_test;

#ifdef COROLLA_HAVE_CUDA
namespace {

Backend& gpu() { return backend_for({device_kind::cuda, 0}); }
Backend& cpu() { return cpu_backend(); }

Tensor up(const Tensor& h) {
  Tensor d = gpu().empty(h.shape(), h.type());
  gpu().copy(h, d);
  return d;
}

std::vector<double> down(const Tensor& d) {
  Tensor h = Tensor::empty(d.shape(), d.type());
  gpu().copy(d, h);
  return to_double(h);
}

struct restore_precision {
  ~restore_precision() { set_matmul_precision(matmul_precision::f32); }
};

/// Clears COROLLA_ATTENTION_KERNELS (the default family) when it goes.
struct restore_kernels {
  ~restore_kernels() { unsetenv("COROLLA_ATTENTION_KERNELS"); }
};

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// Checks `got` against `want` normwise at magnitude `scale` (see the file
/// comment) and returns the largest difference between `got` and `f32` (the
/// f32 kernels' result).
double check_normwise(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& f32,
                      double scale, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0, sum = 0.0, moved = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    worst = std::max(worst, err);
    sum += err;
    moved = std::max(moved, std::abs(got[i] - f32[i]));
  }
  const double mean = want.empty() ? 0.0 : sum / static_cast<double>(want.size());
  const double bound = 3e-2 * scale;
  INFO(what << ": largest error " << worst << ", mean " << mean << ", bound " << bound << " (magnitude " << scale << ")");
  CHECK(worst <= bound);
  CHECK(mean <= 4e-3 * scale);
  return moved;
}

}  // namespace
#endif

TEST_CASE("cuda: training attention on the tensor cores (bf16 precision) matches the cpu within bf16 rounding") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  restore_precision guard;
  restore_kernels kernels_guard;
  struct config {
    int hq, hkv, dh, batch, seq;
  };
  for (const std::string family : {"fa", "wmma"}) {
    CAPTURE(family);
    setenv("COROLLA_ATTENTION_KERNELS", family.c_str(), 1);
    rng r(211);
    // Every head size with kernels (32, 64, 96, 128), MHA and GQA, sequences
    // of one row, of whole 64-row tiles and of partial ones.
    for (const config& c : {config{4, 4, 64, 2, 130}, config{8, 2, 128, 1, 200}, config{6, 2, 32, 1, 64},
                            config{2, 1, 96, 2, 65}, config{4, 2, 64, 1, 1}, config{2, 2, 128, 1, 256}}) {
      CAPTURE(c.hq);
      CAPTURE(c.hkv);
      CAPTURE(c.dh);
      CAPTURE(c.batch);
      CAPTURE(c.seq);
      const attention_shape s{c.hq, c.hkv, c.dh, 0.0f};
      const std::int64_t rows = std::int64_t{c.batch} * c.seq;
      const std::int64_t qw = std::int64_t{c.hq} * c.dh, kw = std::int64_t{c.hkv} * c.dh;
      Tensor q = random_tensor({rows, qw}, r), k = random_tensor({rows, kw}, r), v = random_tensor({rows, kw}, r),
             g = random_tensor({rows, qw}, r);
      Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({std::int64_t{c.batch} * c.hq * c.seq});
      cpu().attention(q, k, v, c.batch, c.seq, s, out, &lse);
      Tensor gq = Tensor::empty({rows, qw}), gk = Tensor::empty({rows, kw}), gv = Tensor::empty({rows, kw});
      cpu().attention_backward(q, k, v, out, lse, g, c.batch, c.seq, s, gq, gk, gv);

      const Tensor dq_in = up(q), dk_in = up(k), dv_in = up(v), dg = up(g), d_out_ref = up(out), d_lse_ref = up(lse);
      cuda::attention_dims dims;
      dims.dh = c.dh;
      // Hopper (the default build, sm_90) takes every case; another GPU may
      // lack the shared memory for head size 128 and keep the f32 kernels.
      const bool hopper = cuda::device_description(0).find("sm_90") != std::string::npos;
      const bool tensor_cores = cuda::attention_mma_supported(dims, {dq_in.raw(), dk_in.raw(), dv_in.raw()});
      if (hopper) CHECK(tensor_cores);
      if (!tensor_cores) MESSAGE("the tensor-core kernels do not take this case on " << cuda::device_description(0));
      // Both precisions on the device: f32 (the tiled kernels) and bf16.
      std::vector<double> results[2][5];
      for (int p = 0; p < 2; ++p) {
        set_matmul_precision(p == 0 ? matmul_precision::f32 : matmul_precision::bf16);
        Tensor o = gpu().empty(out.shape()), l = gpu().empty(lse.shape());
        gpu().attention(dq_in, dk_in, dv_in, c.batch, c.seq, s, o, &l);
        // The backward takes the cpu's out and lse, so its check is independent of the forward's.
        Tensor a = gpu().empty(gq.shape()), b = gpu().empty(gk.shape()), d = gpu().empty(gv.shape());
        gpu().attention_backward(dq_in, dk_in, dv_in, d_out_ref, d_lse_ref, dg, c.batch, c.seq, s, a, b, d);
        results[p][0] = down(o);
        results[p][1] = down(l);
        results[p][2] = down(a);
        results[p][3] = down(b);
        results[p][4] = down(d);
      }
      const std::vector<double> want[5] = {to_double(out), to_double(lse), to_double(gq), to_double(gk), to_double(gv)};
      const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
      // dq and dk vanish exactly with a single key (out = v), where their bf16
      // residue is on the scale of the other gradients.
      const double grads = std::max({max_abs(want[2]), max_abs(want[3]), max_abs(want[4])});
      const auto magnitude = [&](int i) {
        return i == 0 ? max_abs(want[0]) : i == 1 ? 1.0 : std::max(max_abs(want[i]), 0.25 * grads);
      };
      double moved = 0.0;
      for (int i = 0; i < 5; ++i)
        moved = std::max(moved, check_normwise(results[1][i], want[i], results[0][i],
                                               magnitude(i), names[i]));
      if (tensor_cores) CHECK(moved > 1e-5);  // bf16 rounding shows: the tensor-core kernels ran

      // bf16 tensors (mixed-precision training) take the same kernels at any
      // precision: the forward equals the f32 tensors' at bf16 precision,
      // rounded once, lse exactly; the backward (its delta now dout . out of
      // the bf16 values) keeps the bound.
      if (!tensor_cores) continue;
      set_matmul_precision(matmul_precision::f32);
      const auto b16 = [](const Tensor& t) { return up(t.to(dtype::bf16)); };
      const auto rounded = [](const std::vector<double>& v, const shape_t& shape) {
        std::vector<float> f(v.begin(), v.end());
        return to_double(Tensor::from_f32(f, shape).to(dtype::bf16));
      };
      const Tensor hq_in = b16(q), hk_in = b16(k), hv_in = b16(v), hg = b16(g), h_out_ref = b16(out);
      Tensor o = gpu().empty(out.shape(), dtype::bf16), l = gpu().empty(lse.shape());
      gpu().attention(hq_in, hk_in, hv_in, c.batch, c.seq, s, o, &l);
      CHECK(down(o) == rounded(results[1][0], out.shape()));
      CHECK(down(l) == results[1][1]);
      Tensor a = gpu().empty(gq.shape(), dtype::bf16), b = gpu().empty(gk.shape(), dtype::bf16),
             d = gpu().empty(gv.shape(), dtype::bf16);
      gpu().attention_backward(hq_in, hk_in, hv_in, h_out_ref, d_lse_ref, hg, c.batch, c.seq, s, a, b, d);
      check_normwise(down(a), want[2], results[0][2], magnitude(2), "dq of bf16 tensors");
      check_normwise(down(b), want[3], results[0][3], magnitude(3), "dk of bf16 tensors");
      check_normwise(down(d), want[4], results[0][4], magnitude(4), "dv of bf16 tensors");

      // f16 tensors (mixed-precision training in f16) take them too, with f16
      // tiles, P and dS: within the bound, and closer to the cpu than bf16
      // (three more bits; tests/cuda_emulated/ checks the roundings exactly).
      const auto f16 = [](const Tensor& t) { return up(t.to(dtype::f16)); };
      const Tensor fq_in = f16(q), fk_in = f16(k), fv_in = f16(v), fg = f16(g), f_out_ref = f16(out);
      Tensor fo = gpu().empty(out.shape(), dtype::f16), fl = gpu().empty(lse.shape());
      gpu().attention(fq_in, fk_in, fv_in, c.batch, c.seq, s, fo, &fl);
      const std::vector<double> f_out = down(fo);
      check_normwise(f_out, want[0], results[0][0], magnitude(0), "out of f16 tensors");
      check_normwise(down(fl), want[1], results[0][1], 1.0, "lse of f16 tensors");
      double f16_err = 0.0, bf16_err = 0.0;
      for (std::size_t i = 0; i < want[0].size(); ++i) {
        f16_err = std::max(f16_err, std::abs(f_out[i] - want[0][i]));
        bf16_err = std::max(bf16_err, std::abs(results[1][0][i] - want[0][i]));
      }
      INFO("largest error of out: f16 tensors " << f16_err << ", bf16 tiles " << bf16_err);
      CHECK(f16_err < 0.5 * bf16_err);
      // They ran on the tensor cores: f16 P rounding moves the result away
      // from the tiled kernels' (f32 P) on the same f16 tensors. Not at one
      // position: its only P is exactly 1, which f16 holds.
      cuda::attention_dims g16;
      g16.hq = c.hq;
      g16.hkv = c.hkv;
      g16.dh = c.dh;
      g16.group = c.hq / c.hkv;
      g16.q_width = qw;
      g16.kv_width = kw;
      g16.scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
      Tensor tiled_o = gpu().empty(out.shape(), dtype::f16), tiled_l = gpu().empty(lse.shape());
      auto& cb = static_cast<cuda::cuda_backend&>(gpu());
      REQUIRE(cuda::attention_forward_tiled(cb.stream(), g16, cuda::elem::f16, fq_in.raw(), fk_in.raw(), fv_in.raw(),
                                            c.batch, c.seq, tiled_o.raw(), tiled_l.data<float>()));
      const std::vector<double> f_tiled = down(tiled_o);
      double f16_moved = 0.0;
      for (std::size_t i = 0; i < f_out.size(); ++i) f16_moved = std::max(f16_moved, std::abs(f_out[i] - f_tiled[i]));
      if (c.seq > 1) CHECK(f16_moved > 0.0);
      Tensor fa = gpu().empty(gq.shape(), dtype::f16), fb = gpu().empty(gk.shape(), dtype::f16),
             fd = gpu().empty(gv.shape(), dtype::f16);
      gpu().attention_backward(fq_in, fk_in, fv_in, f_out_ref, d_lse_ref, fg, c.batch, c.seq, s, fa, fb, fd);
      check_normwise(down(fa), want[2], results[0][2], magnitude(2), "dq of f16 tensors");
      check_normwise(down(fb), want[3], results[0][3], magnitude(3), "dk of f16 tensors");
      check_normwise(down(fd), want[4], results[0][4], magnitude(4), "dv of f16 tensors");
    }
  }
#endif
}

TEST_CASE("cuda: COROLLA_ATTENTION_KERNELS chooses the tensor-core kernel family, and names a wrong value") {
#ifdef COROLLA_HAVE_CUDA
  restore_kernels guard;
  unsetenv("COROLLA_ATTENTION_KERNELS");
  CHECK(cuda::mma_attention_kernels_in_use() == cuda::mma_attention_kernels::fa);
  setenv("COROLLA_ATTENTION_KERNELS", "wmma", 1);
  CHECK(cuda::mma_attention_kernels_in_use() == cuda::mma_attention_kernels::wmma);
  setenv("COROLLA_ATTENTION_KERNELS", "fa", 1);
  CHECK(cuda::mma_attention_kernels_in_use() == cuda::mma_attention_kernels::fa);
  setenv("COROLLA_ATTENTION_KERNELS", "flash", 1);
  CHECK_THROWS_WITH_AS(cuda::mma_attention_kernels_in_use(),
                       doctest::Contains("COROLLA_ATTENTION_KERNELS='flash'"), std::invalid_argument);
#endif
}

TEST_CASE("cuda: at bf16 precision, head sizes without tensor-core kernels keep the f32 kernels") {
  REQUIRE_GPU_OR_SKIP();
#ifdef COROLLA_HAVE_CUDA
  restore_precision guard;
  rng r(212);
  const int hq = 2, hkv = 1, dh = 80, seq = 40;
  const attention_shape s{hq, hkv, dh, 0.0f};
  cuda::attention_dims dims;
  dims.dh = dh;
  CHECK_FALSE(cuda::attention_mma_supported(dims, {}));
  Tensor q = random_tensor({seq, hq * dh}, r), k = random_tensor({seq, hkv * dh}, r), v = random_tensor({seq, hkv * dh}, r);
  Tensor out = Tensor::empty({seq, hq * dh});
  cpu().attention(q, k, v, 1, seq, s, out, nullptr);
  set_matmul_precision(matmul_precision::bf16);
  Tensor o = gpu().empty(out.shape());
  gpu().attention(up(q), up(k), up(v), 1, seq, s, o, nullptr);
  check_close(down(o), to_double(out), 1e-4, 1e-5, "attention out, head size 80 at bf16 precision");
#endif
}
