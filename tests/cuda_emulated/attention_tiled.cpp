// tests/cuda_emulated/attention_tiled.cpp — the tiled f32 training attention
// (kernels/cuda/attention_tiled_kernels.cuh: forward, dq, dk/dv; what
// training runs at the default f32 precision for head sizes up to 128),
// compiled as host C++ against cuda_emulation.hpp and launched as
// attention_tiled.cu launches them, against the CPU backend's attention and
// attention_backward. Covers several 32-row tiles with a partial last one,
// grouped-query heads (dk/dv summing over a group's query heads), batches,
// and the three register widths (head sizes 32, 64, and 80 with idle
// lanes). tests/kernels/ checks the same on a GPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/cuda_emulated/emulated_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/attention_tiled_kernels.cuh"

using namespace corolla;
using emulated_test::as;
using emulated_test::f;
using emulated_test::rounded_to;
using emulated_test::widened;
using kernel_test::check_close;
using kernel_test::to_double;

namespace {

template <int C, class T>
void run_tiled(const cuda::tiled_args<T>& a, bool backward) {
  const unsigned tiles = cuda::tiles_of(a.seq);
  if (!backward) {
    emulated::launch(&cuda::flash_forward_kernel<C, T>,
                     {static_cast<unsigned>(a.batch * a.g.hq), tiles, cuda::tile_threads, cuda::tiled_smem<C>(3)}, a);
    return;
  }
  emulated::launch(&cuda::flash_dq_kernel<C, T>,
                   {static_cast<unsigned>(a.batch * a.g.hq), tiles, cuda::tile_threads, cuda::tiled_smem<C>(4)}, a);
  emulated::launch(&cuda::flash_dkdv_kernel<C, T>,
                   {static_cast<unsigned>(a.batch * a.g.hkv), tiles, cuda::tile_threads, cuda::tiled_smem<C>(4)}, a);
}

template <class T>
void run(const cuda::tiled_args<T>& a, bool backward) {
  if (a.g.dh <= 32)
    run_tiled<1, T>(a, backward);
  else if (a.g.dh <= 64)
    run_tiled<2, T>(a, backward);
  else
    run_tiled<4, T>(a, backward);
}

}  // namespace

TEST_CASE("emulated tiled training attention matches the cpu's attention, forward and backward") {
  kernel_test::rng r(929);
  struct shape {
    std::int64_t batch, seq;
    int hq, hkv, dh;
  };
  for (const shape& c : {shape{1, 40, 2, 1, 64}, shape{2, 33, 1, 1, 32}, shape{1, 20, 2, 2, 80}}) {
    CAPTURE(c.batch);
    CAPTURE(c.seq);
    CAPTURE(c.dh);
    const std::int64_t rows = c.batch * c.seq, qw = std::int64_t{c.hq} * c.dh, kw = std::int64_t{c.hkv} * c.dh;
    const Tensor q = kernel_test::random_tensor({rows, qw}, r), k = kernel_test::random_tensor({rows, kw}, r),
                 v = kernel_test::random_tensor({rows, kw}, r), dout = kernel_test::random_tensor({rows, qw}, r);
    attention_shape s;
    s.n_heads = c.hq;
    s.n_kv_heads = c.hkv;
    s.head_dim = c.dh;
    Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({c.batch * c.hq * c.seq});
    cpu_backend().attention(q, k, v, static_cast<int>(c.batch), static_cast<int>(c.seq), s, out, &lse);
    Tensor dq = Tensor::empty({rows, qw}), dk = Tensor::empty({rows, kw}), dv = Tensor::empty({rows, kw});
    cpu_backend().attention_backward(q, k, v, out, lse, dout, static_cast<int>(c.batch), static_cast<int>(c.seq), s,
                                     dq, dk, dv);

    cuda::tiled_args<float> a{};
    a.q = f(q);
    a.k = f(k);
    a.v = f(v);
    a.batch = c.batch;
    a.seq = c.seq;
    a.g = {c.hq, c.hkv, c.dh, c.hq / c.hkv, qw, kw, 1.0f / std::sqrt(static_cast<float>(c.dh))};
    Tensor got_out = kernel_test::filled({rows, qw}, NAN), got_lse = kernel_test::filled({c.batch * c.hq * c.seq}, NAN);
    a.out_w = f(got_out);
    a.lse_w = f(got_lse);
    run(a, false);
    check_close(got_out, to_double(out), 1e-5, 1e-6, "tiled attention out");
    check_close(got_lse, to_double(lse), 1e-5, 1e-6, "tiled attention lse");

    // delta = dout . out per (batch, head, position), as attention.cu's delta kernel writes it.
    std::vector<float> delta(static_cast<std::size_t>(c.batch * c.hq * c.seq));
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.hq; ++h)
        for (std::int64_t t = 0; t < c.seq; ++t) {
          double sum = 0;
          for (int d = 0; d < c.dh; ++d) {
            const std::int64_t e = (b * c.seq + t) * qw + h * c.dh + d;
            sum += static_cast<double>(dout.data<float>()[e]) * out.data<float>()[e];
          }
          delta[static_cast<std::size_t>((b * c.hq + h) * c.seq + t)] = static_cast<float>(sum);
        }
    Tensor got_dq = kernel_test::filled({rows, qw}, NAN), got_dk = kernel_test::filled({rows, kw}, NAN),
           got_dv = kernel_test::filled({rows, kw}, NAN);
    a.lse = f(lse);
    a.dout = f(dout);
    a.delta = delta.data();
    a.dq = f(got_dq);
    a.dk = f(got_dk);
    a.dv = f(got_dv);
    run(a, true);
    check_close(got_dq, to_double(dq), 1e-4, 1e-5, "tiled attention dq");
    check_close(got_dk, to_double(dk), 1e-4, 1e-5, "tiled attention dk");
    check_close(got_dv, to_double(dv), 1e-4, 1e-5, "tiled attention dv");
  }
}

namespace {

/// The tiled kernels in 16-bit storage against the f32 ones on the widened
/// inputs: the same f32 arithmetic, so equal after one rounding.
template <class T>
void check_tiled_16bit(dtype dt, kernel_test::rng& r) {
  const std::int64_t batch = 1, seq = 35, rows = batch * seq;
  const int hq = 2, hkv = 1, dh = 64;
  const std::int64_t qw = hq * dh, kw = hkv * dh;
  const Tensor q = kernel_test::random_tensor({rows, qw}, r).to(dt), k = kernel_test::random_tensor({rows, kw}, r).to(dt),
               v = kernel_test::random_tensor({rows, kw}, r).to(dt), dout = kernel_test::random_tensor({rows, qw}, r).to(dt);
  const Tensor qf = q.to(dtype::f32), kf = k.to(dtype::f32), vf = v.to(dtype::f32), doutf = dout.to(dtype::f32);
  const cuda::attention_dims g{hq, hkv, dh, hq / hkv, qw, kw, 0.125f};
  const std::string name = dtype_name(dt);

  Tensor out = Tensor::empty({rows, qw}, dt), outf = Tensor::empty({rows, qw});
  Tensor lse = Tensor::empty({batch * hq * seq}), lsef = Tensor::empty({batch * hq * seq});
  cuda::tiled_args<T> a{};
  a.q = as<T>(q), a.k = as<T>(k), a.v = as<T>(v), a.out_w = as<T>(out), a.lse_w = f(lse);
  a.batch = batch, a.seq = seq, a.g = g;
  cuda::tiled_args<float> af{};
  af.q = f(qf), af.k = f(kf), af.v = f(vf), af.out_w = f(outf), af.lse_w = f(lsef);
  af.batch = batch, af.seq = seq, af.g = g;
  run(a, false);
  run(af, false);
  check_close(widened(out), rounded_to(outf, dt), 0, 0, "tiled attention out in " + name);
  check_close(lse, to_double(lsef), 0, 0, "tiled attention lse in " + name);

  std::vector<float> delta(static_cast<std::size_t>(batch * hq * seq), 0.5f);
  Tensor dq = Tensor::empty({rows, qw}, dt), dk = Tensor::empty({rows, kw}, dt), dv = Tensor::empty({rows, kw}, dt);
  Tensor dqf = Tensor::empty({rows, qw}), dkf = Tensor::empty({rows, kw}), dvf = Tensor::empty({rows, kw});
  a.lse = f(lsef), a.dout = as<T>(dout), a.delta = delta.data(), a.dq = as<T>(dq), a.dk = as<T>(dk), a.dv = as<T>(dv);
  af.lse = f(lsef), af.dout = f(doutf), af.delta = delta.data(), af.dq = f(dqf), af.dk = f(dkf), af.dv = f(dvf);
  run(a, true);
  run(af, true);
  check_close(widened(dq), rounded_to(dqf, dt), 0, 0, "tiled attention dq in " + name);
  check_close(widened(dk), rounded_to(dkf, dt), 0, 0, "tiled attention dk in " + name);
  check_close(widened(dv), rounded_to(dvf, dt), 0, 0, "tiled attention dv in " + name);
}

}  // namespace

TEST_CASE("emulated tiled training attention in bf16 and f16 storage is the f32 kernel rounded once") {
  kernel_test::rng r(931);
  check_tiled_16bit<__nv_bfloat16>(dtype::bf16, r);
  check_tiled_16bit<__half>(dtype::f16, r);
}
