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
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/attention_tiled_kernels.cuh"

using namespace corolla;
using kernel_test::check_close;
using kernel_test::to_double;

namespace {

float* f(const Tensor& t) { return static_cast<float*>(t.raw()); }

template <int C>
void run_tiled(cuda::tiled_args a, bool backward) {
  const unsigned tiles = cuda::tiles_of(a.seq);
  if (!backward) {
    emulated::launch(&cuda::flash_forward_kernel<C>,
                     {static_cast<unsigned>(a.batch * a.g.hq), tiles, cuda::tile_threads, cuda::tiled_smem<C>(3)}, a);
    return;
  }
  emulated::launch(&cuda::flash_dq_kernel<C>,
                   {static_cast<unsigned>(a.batch * a.g.hq), tiles, cuda::tile_threads, cuda::tiled_smem<C>(4)}, a);
  emulated::launch(&cuda::flash_dkdv_kernel<C>,
                   {static_cast<unsigned>(a.batch * a.g.hkv), tiles, cuda::tile_threads, cuda::tiled_smem<C>(4)}, a);
}

void run(const cuda::tiled_args& a, bool backward) {
  if (a.g.dh <= 32)
    run_tiled<1>(a, backward);
  else if (a.g.dh <= 64)
    run_tiled<2>(a, backward);
  else
    run_tiled<4>(a, backward);
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

    cuda::tiled_args a{};
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
