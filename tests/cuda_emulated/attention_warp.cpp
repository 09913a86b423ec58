// tests/cuda_emulated/attention_warp.cpp — attention.cu's warp-per-row
// training kernels (kernels/cuda/attention_warp_kernels.cuh: forward, the
// delta of every backward, dq, dk/dv), compiled as host C++ against
// cuda_emulation.hpp and launched as attention.cu launches them, against
// the CPU backend's attention and attention_backward. Head sizes 160 (eight
// floats per lane, past the tiled kernels' 128) and 48 (idle lanes),
// grouped-query heads, two sequences. tests/kernels/ checks the same on a
// GPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/attention_warp_kernels.cuh"

using namespace corolla;
using kernel_test::check_close;
using kernel_test::to_double;

namespace {

float* f(const Tensor& t) { return static_cast<float*>(t.raw()); }

/// attention.cu's grid for one warp per item.
emulated::launch_config warps(std::int64_t items) {
  return {static_cast<unsigned>((items + cuda::warps_per_block - 1) / cuda::warps_per_block), 1, cuda::attn_threads, 0};
}

template <int C>
void run(const cuda::forward_params& fp, const cuda::backward_params& bp) {
  emulated::launch(&cuda::attention_forward_kernel<C>, warps(fp.rows * fp.g.hq), fp);
  const std::int64_t rows = bp.batch * bp.seq;
  emulated::launch(&cuda::attention_delta_kernel<C>, warps(rows * bp.g.hq), bp);
  emulated::launch(&cuda::attention_dq_kernel<C>, warps(rows * bp.g.hq), bp);
  emulated::launch(&cuda::attention_dkdv_kernel<C>, warps(rows * bp.g.hkv), bp);
}

}  // namespace

TEST_CASE("emulated warp-per-row training attention and its delta kernel match the cpu") {
  kernel_test::rng r(953);
  for (const int dh : {160, 48}) {
    CAPTURE(dh);
    const std::int64_t batch = 2, seq = 9;
    const int hq = 4, hkv = 2;
    const std::int64_t rows = batch * seq, qw = std::int64_t{hq} * dh, kw = std::int64_t{hkv} * dh;
    const Tensor q = kernel_test::random_tensor({rows, qw}, r), k = kernel_test::random_tensor({rows, kw}, r),
                 v = kernel_test::random_tensor({rows, kw}, r), dout = kernel_test::random_tensor({rows, qw}, r);
    attention_shape s;
    s.n_heads = hq;
    s.n_kv_heads = hkv;
    s.head_dim = dh;
    Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({batch * hq * seq});
    cpu_backend().attention(q, k, v, static_cast<int>(batch), static_cast<int>(seq), s, out, &lse);
    Tensor dq = Tensor::empty({rows, qw}), dk = Tensor::empty({rows, kw}), dv = Tensor::empty({rows, kw});
    cpu_backend().attention_backward(q, k, v, out, lse, dout, static_cast<int>(batch), static_cast<int>(seq), s, dq,
                                     dk, dv);

    const cuda::attention_dims g{hq, hkv, dh, hq / hkv, qw, kw, 1.0f / std::sqrt(static_cast<float>(dh))};
    Tensor got_out = kernel_test::filled({rows, qw}, NAN), got_lse = kernel_test::filled({batch * hq * seq}, NAN);
    Tensor got_dq = kernel_test::filled({rows, qw}, NAN), got_dk = kernel_test::filled({rows, kw}, NAN),
           got_dv = kernel_test::filled({rows, kw}, NAN), delta = kernel_test::filled({batch * hq * seq}, NAN);
    cuda::forward_params fp;
    fp.q = f(q);
    fp.k = f(k);
    fp.v = f(v);
    fp.out = f(got_out);
    fp.lse = f(got_lse);
    fp.rows = rows;
    fp.seq = seq;
    fp.g = g;
    // The backward reads the cpu's out and lse, so its check is independent of the forward's.
    const cuda::backward_params bp{f(q),      f(k),      f(v),      f(out),  f(lse), f(dout), f(got_dq),
                                   f(got_dk), f(got_dv), f(delta),  batch,   seq,    g};
    if (dh <= 64)
      run<2>(fp, bp);
    else
      run<8>(fp, bp);
    check_close(got_out, to_double(out), 1e-5, 1e-6, "warp attention out");
    check_close(got_lse, to_double(lse), 1e-5, 1e-6, "warp attention lse");
    check_close(got_dq, to_double(dq), 1e-4, 1e-5, "warp attention dq");
    check_close(got_dk, to_double(dk), 1e-4, 1e-5, "warp attention dk");
    check_close(got_dv, to_double(dv), 1e-4, 1e-5, "warp attention dv");
  }
}
