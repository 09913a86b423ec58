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
#include "tests/cuda_emulated/emulated_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/attention_warp_kernels.cuh"

using namespace corolla;
using emulated_test::as;
using emulated_test::f;
using emulated_test::rounded_to;
using emulated_test::widened;
using kernel_test::check_close;
using kernel_test::to_double;

namespace {

/// attention.cu's grid for one warp per item.
emulated::launch_config warps(std::int64_t items) {
  return {static_cast<unsigned>((items + cuda::warps_per_block - 1) / cuda::warps_per_block), 1, cuda::attn_threads, 0};
}

template <int C, class T>
void run(const cuda::forward_params<T>& fp, const cuda::backward_params<T>& bp) {
  emulated::launch(&cuda::attention_forward_kernel<C, T>, warps(fp.rows * fp.g.hq), fp);
  const std::int64_t rows = bp.batch * bp.seq;
  emulated::launch(&cuda::attention_delta_kernel<C, T>, warps(rows * bp.g.hq), bp);
  emulated::launch(&cuda::attention_dq_kernel<C, T>, warps(rows * bp.g.hq), bp);
  emulated::launch(&cuda::attention_dkdv_kernel<C, T>, warps(rows * bp.g.hkv), bp);
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
    cuda::forward_params<float> fp;
    fp.q = f(q);
    fp.k = f(k);
    fp.v = f(v);
    fp.out = f(got_out);
    fp.lse = f(got_lse);
    fp.rows = rows;
    fp.seq = seq;
    fp.g = g;
    // The backward reads the cpu's out and lse, so its check is independent of the forward's.
    const cuda::backward_params<float> bp{f(q),      f(k),      f(v),      f(out),  f(lse), f(dout), f(got_dq),
                                   f(got_dk), f(got_dv), f(delta),  batch,   seq,    g};
    if (dh <= 64)
      run<2, float>(fp, bp);
    else
      run<8, float>(fp, bp);
    check_close(got_out, to_double(out), 1e-5, 1e-6, "warp attention out");
    check_close(got_lse, to_double(lse), 1e-5, 1e-6, "warp attention lse");
    check_close(got_dq, to_double(dq), 1e-4, 1e-5, "warp attention dq");
    check_close(got_dk, to_double(dk), 1e-4, 1e-5, "warp attention dk");
    check_close(got_dv, to_double(dv), 1e-4, 1e-5, "warp attention dv");
  }
}

TEST_CASE("emulated warp-per-row training attention in bf16 storage is the f32 kernel rounded once") {
  kernel_test::rng r(967);
  const std::int64_t batch = 1, seq = 7, rows = batch * seq;
  const int hq = 2, hkv = 1, dh = 160;
  const std::int64_t qw = std::int64_t{hq} * dh, kw = std::int64_t{hkv} * dh, stats = batch * hq * seq;
  const cuda::attention_dims g{hq, hkv, dh, hq / hkv, qw, kw, 0.08f};
  Tensor in16[4], in32[4];
  const std::int64_t widths[4] = {qw, kw, kw, qw};  // q, k, v, dout
  for (int i = 0; i < 4; ++i) {
    in16[i] = kernel_test::random_tensor({rows, widths[i]}, r).to(dtype::bf16);
    in32[i] = in16[i].to(dtype::f32);
  }
  auto* const bf = &as<__nv_bfloat16>;
  Tensor out16 = Tensor::empty({rows, qw}, dtype::bf16), out32 = Tensor::empty({rows, qw});
  Tensor lse16 = Tensor::empty({stats}), lse32 = Tensor::empty({stats}), delta16 = Tensor::empty({stats}),
         delta32 = Tensor::empty({stats});
  Tensor g16[3] = {Tensor::empty({rows, qw}, dtype::bf16), Tensor::empty({rows, kw}, dtype::bf16),
                   Tensor::empty({rows, kw}, dtype::bf16)};
  Tensor g32[3] = {Tensor::empty({rows, qw}), Tensor::empty({rows, kw}), Tensor::empty({rows, kw})};
  cuda::forward_params<__nv_bfloat16> f16p;
  f16p.q = bf(in16[0]), f16p.k = bf(in16[1]), f16p.v = bf(in16[2]), f16p.out = bf(out16), f16p.lse = f(lse16);
  f16p.rows = rows, f16p.seq = seq, f16p.g = g;
  cuda::forward_params<float> f32p;
  f32p.q = f(in32[0]), f32p.k = f(in32[1]), f32p.v = f(in32[2]), f32p.out = f(out32), f32p.lse = f(lse32);
  f32p.rows = rows, f32p.seq = seq, f32p.g = g;
  // The backward of both runs from the 16-bit forward's out and lse, widened for the f32 one.
  emulated::launch(&cuda::attention_forward_kernel<8, __nv_bfloat16>, warps(rows * hq), f16p);
  emulated::launch(&cuda::attention_forward_kernel<8, float>, warps(rows * hq), f32p);
  check_close(widened(out16), rounded_to(out32, dtype::bf16), 0, 0,
              "warp attention out in bf16");
  check_close(lse16, to_double(lse32), 0, 0, "warp attention lse in bf16");
  const Tensor out_wide = out16.to(dtype::f32);
  const cuda::backward_params<__nv_bfloat16> b16{bf(in16[0]), bf(in16[1]), bf(in16[2]), bf(out16), f(lse16),
                                                 bf(in16[3]), bf(g16[0]),  bf(g16[1]),  bf(g16[2]), f(delta16),
                                                 batch,       seq,         g};
  const cuda::backward_params<float> b32{f(in32[0]), f(in32[1]), f(in32[2]), f(out_wide), f(lse16), f(in32[3]),
                                         f(g32[0]),  f(g32[1]),  f(g32[2]),  f(delta32),  batch,    seq,
                                         g};
  for (auto k : {&cuda::attention_delta_kernel<8, __nv_bfloat16>, &cuda::attention_dq_kernel<8, __nv_bfloat16>})
    emulated::launch(k, warps(rows * hq), b16);
  emulated::launch(&cuda::attention_dkdv_kernel<8, __nv_bfloat16>, warps(rows * hkv), b16);
  for (auto k : {&cuda::attention_delta_kernel<8, float>, &cuda::attention_dq_kernel<8, float>})
    emulated::launch(k, warps(rows * hq), b32);
  emulated::launch(&cuda::attention_dkdv_kernel<8, float>, warps(rows * hkv), b32);
  check_close(delta16, to_double(delta32), 0, 0, "warp attention delta in bf16");
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i)
    check_close(widened(g16[i]), rounded_to(g32[i], dtype::bf16), 0, 0,
                std::string("warp attention ") + names[i] + " in bf16");
}
