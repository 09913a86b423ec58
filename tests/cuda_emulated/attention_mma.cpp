// tests/cuda_emulated/attention_mma.cpp — the tensor-core attention kernels,
// both families (the register kernels of kernels/cuda/attention_fa_kernels.cuh,
// on the emulated mma.sync and ldmatrix, and the WMMA kernels of
// kernels/cuda/attention_mma_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as attention_mma.cu launches them, against
// the CPU backend's f32 attention. This runs everywhere, GPU or not: it
// checks the kernels' indexing, masking, head grouping, online softmax, tile
// walks, synchronisation points and shared-memory layout (every WMMA access
// inside the launch's shared memory, aligned as CUDA requires). What it
// cannot check is the hardware: tests/kernels/cuda_attention_mma.cpp runs
// the same comparison on a GPU.
//
// Tolerance as on the GPU: |got - want| <= 3e-2 * M and mean error <=
// 4e-3 * M, M = max |want| of the tensor (1 for lse; for dq and dk at least
// a quarter of the largest gradient, since they vanish exactly with a single
// key while their bf16 residue does not). Inputs in [-1, 1]; q, k, v, dout,
// P and dS are rounded to bf16 before each product. Then, tighter, against
// a double-precision reference that rounds exactly where the kernels do:
// within 3e-3 * M (lse within 3e-4), so an error of a few per cent that the
// first bound would let through (a wrong scale, a missed correction) fails.
// bf16 tensors (the storage of mixed-precision training) must give the f32
// tensors' results rounded once, bit for bit. f16 tensors run with f16
// tiles, P and dS: checked against the same reference rounding to f16, and
// closer to the exact attention than the bf16 run (three more bits).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/cuda_emulated/emulated_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros (__CUDA_ARCH__, __device__, ...) must reach
// only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/attention_fa_kernels.cuh"
#include "kernels/cuda/attention_mma_kernels.cuh"

using namespace corolla;
using corolla::cuda::attention_dims;
using corolla::cuda::layout;
using corolla::cuda::mma_args;

namespace {

struct geometry {
  int hq, hkv, batch, seq;
};

/// The kernel family under test (attention_mma.cu launches either).
enum class family { fa, wmma };

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

void check_normwise(const std::vector<float>& got, const std::vector<double>& want, double scale,
                    const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0, sum = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
    sum += err;
  }
  const double mean = want.empty() ? 0.0 : sum / static_cast<double>(want.size());
  INFO(what << ": largest error " << worst << ", mean " << mean << " (magnitude " << scale << ")");
  CHECK(worst <= 3e-2 * scale);
  CHECK(mean <= 4e-3 * scale);
}

/// Attention computed in double with the kernels' own roundings: q, k, v and
/// dout as bf16; forward P (against the running maximum of each 64-key
/// tile, as the online softmax has it) and backward P and dS rounded to bf16
/// before their products; the backward from the given f32 lse and delta.
struct rounded_reference {
  std::vector<double> out, lse, dq, dk, dv;
};

double to_bf16(double x) {
  return static_cast<double>(emulated::to_float(__nv_bfloat16{emulated::bf16_bits(static_cast<float>(x))}));
}
double to_f16(double x) { return static_cast<double>(emulated::from_f16(emulated::f16_bits(static_cast<float>(x)))); }

/// The reference, with `round` (to_bf16 or to_f16) where the kernels round.
rounded_reference reference_with_roundings(const geometry& c, int dh, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& dout, const float* lse_in, const float* delta_in,
                                           double (*round)(double) = to_bf16) {
  const int hq = c.hq, hkv = c.hkv, group = hq / hkv, T = c.seq;
  const std::int64_t qw = std::int64_t{hq} * dh, kw = std::int64_t{hkv} * dh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  auto at = [&](const Tensor& t, std::int64_t width, int b, int i, int h, int d) {
    return round(t.data<float>()[(std::int64_t{b} * T + i) * width + std::int64_t{h} * dh + d]);
  };
  rounded_reference r;
  r.out.assign(static_cast<std::size_t>(std::int64_t{c.batch} * T * qw), 0.0);
  r.dq = r.out;
  r.dk.assign(static_cast<std::size_t>(std::int64_t{c.batch} * T * kw), 0.0);
  r.dv = r.dk;
  r.lse.assign(static_cast<std::size_t>(c.batch * hq * T), 0.0);
  std::vector<double> s(static_cast<std::size_t>(T));
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < hq; ++h) {
      const int kh = h / group;
      for (int i = 0; i < T; ++i) {
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int d = 0; d < dh; ++d) dot += at(q, qw, b, i, h, d) * at(k, kw, b, j, kh, d);
          s[static_cast<std::size_t>(j)] = dot * scale;
        }
        double m = -INFINITY, l = 0.0;
        std::vector<double> o(static_cast<std::size_t>(dh), 0.0);
        for (int k0 = 0; k0 <= i; k0 += 64) {
          const int k1 = std::min(i + 1, k0 + 64);
          double mx = -INFINITY;
          for (int j = k0; j < k1; ++j) mx = std::max(mx, s[static_cast<std::size_t>(j)]);
          const double m_new = std::max(m, mx), corr = std::exp(m - m_new);
          double sum = 0.0;
          std::vector<double> pv(static_cast<std::size_t>(dh), 0.0);
          for (int j = k0; j < k1; ++j) {
            const double p = std::exp(s[static_cast<std::size_t>(j)] - m_new);
            sum += p;
            for (int d = 0; d < dh; ++d) pv[static_cast<std::size_t>(d)] += round(p) * at(v, kw, b, j, kh, d);
          }
          l = l * corr + sum;
          m = m_new;
          for (int d = 0; d < dh; ++d)
            o[static_cast<std::size_t>(d)] = o[static_cast<std::size_t>(d)] * corr + pv[static_cast<std::size_t>(d)];
        }
        const std::size_t row = static_cast<std::size_t>((b * hq + h) * T + i);
        for (int d = 0; d < dh; ++d)
          r.out[static_cast<std::size_t>((std::int64_t{b} * T + i) * qw + std::int64_t{h} * dh + d)] =
              o[static_cast<std::size_t>(d)] / l;
        r.lse[row] = m + std::log(l);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[static_cast<std::size_t>(j)] - static_cast<double>(lse_in[row]));
          double dp = 0.0;
          for (int d = 0; d < dh; ++d) dp += at(dout, qw, b, i, h, d) * at(v, kw, b, j, kh, d);
          const double ds = round(p * (dp - static_cast<double>(delta_in[row])));
          for (int d = 0; d < dh; ++d) {
            r.dq[static_cast<std::size_t>((std::int64_t{b} * T + i) * qw + std::int64_t{h} * dh + d)] +=
                scale * ds * at(k, kw, b, j, kh, d);
            r.dk[static_cast<std::size_t>((std::int64_t{b} * T + j) * kw + std::int64_t{kh} * dh + d)] +=
                scale * ds * at(q, qw, b, i, h, d);
            r.dv[static_cast<std::size_t>((std::int64_t{b} * T + j) * kw + std::int64_t{kh} * dh + d)] +=
                round(p) * at(dout, qw, b, i, h, d);
          }
        }
      }
    }
  return r;
}

/// The largest |got - want| (infinity for a NaN).
template <class G>
double max_error(const std::vector<G>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  return worst;
}

/// |got - want| <= 3e-3 * scale everywhere: against the rounded reference
/// only f32 summation order and the odd 16-bit tie flipping remain.
template <class G>
void check_tight(const std::vector<G>& got, const std::vector<double>& want, double scale, const std::string& what) {
  const double worst = max_error(got, want);
  INFO(what << " against the rounded reference: largest error " << worst << " (magnitude " << scale << ")");
  CHECK(worst <= 3e-3 * scale);
}

/// The forward, dq and dk/dv kernels of family f on `a`, with
/// attention_mma.cu's grids and shared memory.
template <int D, class T>
void launch_kernels(const geometry& c, const mma_args<T>& a, family f) {
  const unsigned tiles = static_cast<unsigned>((c.seq + 63) / 64);
  const auto bq = static_cast<unsigned>(c.batch * c.hq), bkv = static_cast<unsigned>(c.batch * c.hkv);
  if (f == family::fa) {
    using L = cuda::fa_layout<D>;
    emulated::launch(&cuda::fa_forward_kernel<D, T>, {bq, tiles, cuda::threads, L::forward_bytes}, a);
    emulated::launch(&cuda::fa_dq_kernel<D, T>, {bq, tiles, cuda::threads, L::backward_bytes}, a);
    emulated::launch(&cuda::fa_dkdv_kernel<D, T>, {bkv, tiles, cuda::threads, L::backward_bytes}, a);
    return;
  }
  emulated::launch(&cuda::mma_forward_kernel<D, T>, {bq, tiles, cuda::threads, layout<D>::bytes(3)}, a);
  emulated::launch(&cuda::mma_dq_kernel<D, T>, {bq, tiles, cuda::threads, layout<D>::bytes(4)}, a);
  emulated::launch(&cuda::mma_dkdv_kernel<D, T>, {bkv, tiles, cuda::threads, layout<D>::bytes(4)}, a);
}

/// What the kernels wrote for tensors of a 16-bit storage type.
struct storage_run {
  Tensor out, dq, dk, dv;  ///< of the storage type
  std::vector<float> lse;
};

/// The three kernels, launched as attention_mma.cu launches them, on q, k,
/// v and dout converted to `dt` (device type T), with the f32 run's
/// geometry and backward statistics (`f32`); every output starts as NaN, so
/// an element never written fails the comparisons.
template <int D, class T>
storage_run run_storage(const geometry& c, const mma_args<float>& f32, dtype dt, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& dout, family f) {
  using emulated_test::as;
  const std::int64_t rows = std::int64_t{c.batch} * c.seq;
  const auto nans = [&](std::int64_t w) {
    return Tensor::from_f32(std::vector<float>(static_cast<std::size_t>(rows * w), NAN), {rows, w}).to(dt);
  };
  const Tensor tq = q.to(dt), tk = k.to(dt), tv = v.to(dt), tg = dout.to(dt);
  storage_run run{nans(f32.g.q_width), nans(f32.g.q_width), nans(f32.g.kv_width), nans(f32.g.kv_width),
                  std::vector<float>(static_cast<std::size_t>(c.batch * c.hq * c.seq), NAN)};
  mma_args<T> a{};
  a.seq = f32.seq;
  a.g = f32.g;
  a.q = as<T>(tq);
  a.k = as<T>(tk);
  a.v = as<T>(tv);
  a.dout = as<T>(tg);
  a.lse = f32.lse;
  a.delta = f32.delta;
  a.out = as<T>(run.out);
  a.lse_w = run.lse.data();
  a.dq = as<T>(run.dq);
  a.dk = as<T>(run.dk);
  a.dv = as<T>(run.dv);
  launch_kernels<D>(c, a, f);
  return run;
}

template <int D>
void check_case(const geometry& c, kernel_test::rng& r, family f) {
  INFO((f == family::fa ? "register (fa) kernels" : "WMMA kernels"));
  CAPTURE(D);
  CAPTURE(c.hq);
  CAPTURE(c.hkv);
  CAPTURE(c.batch);
  CAPTURE(c.seq);
  const attention_shape s{c.hq, c.hkv, D, 0.0f};
  const std::int64_t rows = std::int64_t{c.batch} * c.seq, qw = std::int64_t{c.hq} * D, kw = std::int64_t{c.hkv} * D;
  Tensor q = kernel_test::random_tensor({rows, qw}, r), k = kernel_test::random_tensor({rows, kw}, r),
         v = kernel_test::random_tensor({rows, kw}, r), g = kernel_test::random_tensor({rows, qw}, r);
  Backend& cpu = cpu_backend();
  Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({std::int64_t{c.batch} * c.hq * c.seq});
  cpu.attention(q, k, v, c.batch, c.seq, s, out, &lse);
  Tensor dq = Tensor::empty({rows, qw}), dk = Tensor::empty({rows, kw}), dv = Tensor::empty({rows, kw});
  cpu.attention_backward(q, k, v, out, lse, g, c.batch, c.seq, s, dq, dk, dv);
  // delta = dout . out per row and head, as attention.cu's delta kernel.
  std::vector<float> delta(static_cast<std::size_t>(lse.numel()));
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.hq; ++h)
      for (int t = 0; t < c.seq; ++t) {
        double d = 0.0;
        for (int e = 0; e < D; ++e) {
          const std::int64_t i = (std::int64_t{b} * c.seq + t) * qw + std::int64_t{h} * D + e;
          d += static_cast<double>(g.data<float>()[i]) * out.data<float>()[i];
        }
        delta[static_cast<std::size_t>((b * c.hq + h) * c.seq + t)] = static_cast<float>(d);
      }

  mma_args<float> a{};
  a.seq = c.seq;
  a.g.hq = c.hq;
  a.g.hkv = c.hkv;
  a.g.dh = D;
  a.g.group = c.hq / c.hkv;
  a.g.q_width = qw;
  a.g.kv_width = kw;
  a.g.scale = 1.0f / std::sqrt(static_cast<float>(D));  // attention_shape's default
  a.q = q.data<float>();
  a.k = k.data<float>();
  a.v = v.data<float>();
  a.dout = g.data<float>();
  a.lse = lse.data<float>();
  a.delta = delta.data();
  // Outputs start as NaN: an element the kernels never write fails the check.
  std::vector<float> e_out(static_cast<std::size_t>(rows * qw), NAN), e_lse(delta.size(), NAN),
      e_dq(e_out.size(), NAN), e_dk(static_cast<std::size_t>(rows * kw), NAN), e_dv(e_dk.size(), NAN);
  a.out = e_out.data();
  a.lse_w = e_lse.data();
  a.dq = e_dq.data();
  a.dk = e_dk.data();
  a.dv = e_dv.data();
  launch_kernels<D>(c, a, f);

  const auto want = [](const Tensor& t) { return kernel_test::to_double(t); };
  const double grads = std::max({max_abs(want(dq)), max_abs(want(dk)), max_abs(want(dv))});
  const auto grad_scale = [&](const Tensor& t) { return std::max(max_abs(want(t)), 0.25 * grads); };
  check_normwise(e_out, want(out), max_abs(want(out)), "out");
  check_normwise(e_lse, want(lse), 1.0, "lse");
  check_normwise(e_dq, want(dq), grad_scale(dq), "dq");
  check_normwise(e_dk, want(dk), grad_scale(dk), "dk");
  check_normwise(e_dv, want(dv), grad_scale(dv), "dv");

  const rounded_reference ref = reference_with_roundings(c, D, q, k, v, g, lse.data<float>(), delta.data());
  check_tight(e_out, ref.out, max_abs(ref.out), "out");
  check_tight(e_lse, ref.lse, 0.1, "lse");  // 3e-4 absolute
  check_tight(e_dq, ref.dq, grad_scale(dq), "dq");
  check_tight(e_dk, ref.dk, grad_scale(dk), "dk");
  check_tight(e_dv, ref.dv, grad_scale(dv), "dv");

  // bf16 storage (mixed-precision training): the same kernels on bf16
  // tensors of these values give the f32 run's results rounded once, bit
  // for bit: the f32 run rounds its operands to bf16 as it stages them, so
  // the arithmetic is the same; lse stays f32 and equal.
  const storage_run bf = run_storage<D, __nv_bfloat16>(c, a, dtype::bf16, q, k, v, g, f);
  const auto rounded = [](const std::vector<float>& v, std::int64_t w) {
    return emulated_test::rounded_to(Tensor::from_f32(v, {static_cast<std::int64_t>(v.size()) / w, w}), dtype::bf16);
  };
  CHECK(emulated_test::widened(bf.out) == rounded(e_out, qw));
  CHECK(bf.lse == e_lse);
  CHECK(emulated_test::widened(bf.dq) == rounded(e_dq, qw));
  CHECK(emulated_test::widened(bf.dk) == rounded(e_dk, kw));
  CHECK(emulated_test::widened(bf.dv) == rounded(e_dv, kw));

  // f16 storage (mixed-precision training in f16): f16 tiles, P and dS.
  const storage_run fr = run_storage<D, __half>(c, a, dtype::f16, q, k, v, g, f);
  const rounded_reference ref16 =
      reference_with_roundings(c, D, q, k, v, g, lse.data<float>(), delta.data(), to_f16);
  using emulated_test::widened;
  check_tight(widened(fr.out), ref16.out, max_abs(ref16.out), "f16 out");
  check_tight(fr.lse, ref16.lse, 0.1, "f16 lse");
  check_tight(widened(fr.dq), ref16.dq, grad_scale(dq), "f16 dq");
  check_tight(widened(fr.dk), ref16.dk, grad_scale(dk), "f16 dk");
  check_tight(widened(fr.dv), ref16.dv, grad_scale(dv), "f16 dv");
  // Three more bits than bf16: closer to the exact (cpu f32) attention.
  const double f16_err = max_error(widened(fr.out), want(out)), bf16_err = max_error(e_out, want(out));
  INFO("largest error of out against the cpu: f16 tiles " << f16_err << ", bf16 tiles " << bf16_err);
  CHECK(f16_err < 0.5 * bf16_err);
}

}  // namespace

TEST_CASE("emulated tensor-core attention, register kernels: head sizes 32 and 64 match the cpu (one token, partial and whole tiles, GQA)") {
  kernel_test::rng r(301);
  check_case<32>({2, 2, 1, 1}, r, family::fa);
  check_case<32>({4, 2, 2, 65}, r, family::fa);
  check_case<64>({3, 1, 1, 130}, r, family::fa);
  check_case<64>({4, 4, 1, 17}, r, family::fa);
}

TEST_CASE("emulated tensor-core attention, register kernels: head sizes 96 and 128 match the cpu") {
  kernel_test::rng r(302);
  check_case<96>({2, 1, 2, 65}, r, family::fa);
  check_case<128>({4, 2, 1, 130}, r, family::fa);
  check_case<128>({2, 2, 1, 64}, r, family::fa);
}

TEST_CASE("emulated tensor-core attention, WMMA kernels: head sizes 32 and 64 match the cpu (one token, partial and whole tiles, GQA)") {
  kernel_test::rng r(301);
  check_case<32>({2, 2, 1, 1}, r, family::wmma);
  check_case<32>({4, 2, 2, 65}, r, family::wmma);
  check_case<64>({3, 1, 1, 130}, r, family::wmma);
  check_case<64>({4, 4, 1, 17}, r, family::wmma);
}

TEST_CASE("emulated tensor-core attention, WMMA kernels: head sizes 96 and 128 match the cpu") {
  kernel_test::rng r(302);
  check_case<96>({2, 1, 2, 65}, r, family::wmma);
  check_case<128>({4, 2, 1, 130}, r, family::wmma);
  check_case<128>({2, 2, 1, 64}, r, family::wmma);
}
