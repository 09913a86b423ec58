// tests/cuda_emulated/nf4.cpp — the NF4 kernels (kernels/cuda/nf4_kernels.cuh),
// compiled as host C++ against cuda_emulation.hpp and launched as nf4.cu
// launches them, against the CPU backend: quantisation gives the CPU's
// codes and absmax bit for bit, dequantisation its values bit for bit, and
// the GEMV equals the CPU's linear_nf4 up to summation order. Covers the
// 4-byte path (in % 8 == 0) and the per-value one, partial blocks and odd
// rows, one and several passes of 8 rows, a partial block of output
// channels, with and without bias.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/nf4.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernel.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/nf4_kernels.cuh"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("emulated nf4 quantisation and dequantisation equal the cpu's bit for bit") {
  Backend& be = cpu_backend();
  rng r(51);
  for (std::int64_t in : {64, 128, 100, 37}) {
    CAPTURE(in);
    const std::int64_t out = 11;
    Tensor w = random_tensor({out, in}, r, -2.0f, 2.0f);
    for (std::int64_t k = 0; k < in; ++k) w.data<float>()[3 * in + k] = 0.0f;  // an all-zero row
    const quantized_weight want = quantize_rows(be, w, weight_format::nf4);
    Tensor q = Tensor::empty(want.q.shape(), dtype::i8), absmax = Tensor::empty(want.scale.shape());
    const std::int64_t n = out * nf4_row_blocks(in);
    emulated::launch(&cuda::quantize_nf4_kernel,
                     emulated::launch_config{static_cast<unsigned>((n + cuda::nf4_quant_threads - 1) / cuda::nf4_quant_threads), 1,
                                             static_cast<unsigned>(cuda::nf4_quant_threads), 0},
                     w.data<float>(), out, in, nf4_tables_of(), reinterpret_cast<std::uint8_t*>(q.data<std::int8_t>()),
                     absmax.data<float>());
    CHECK(same_values(q, want.q));
    CHECK(same_values(absmax, want.scale));

    Tensor cpu_w = Tensor::empty({out, in}), dev_w = filled({out, in}, std::nanf(""));
    be.dequantize_nf4(want.q, want.scale, cpu_w);
    emulated::launch(&cuda::dequantize_nf4_kernel, emulated::launch_config{4, 1, 64, 0},
                     reinterpret_cast<const std::uint8_t*>(want.q.data<std::int8_t>()), want.scale.data<float>(), out, in,
                     nf4_tables_of(), dev_w.data<float>());
    CHECK(same_values(dev_w, cpu_w));
  }
}

TEST_CASE("emulated nf4-weight GEMV equals the cpu's linear_nf4") {
  Backend& be = cpu_backend();
  rng r(52);
  struct sizes {
    std::int64_t in, out;
  };
  for (sizes s : {sizes{64, 19}, sizes{128, 8}, sizes{100, 11}, sizes{37, 9}}) {
    const quantized_weight w = quantize_rows(be, random_tensor({s.out, s.in}, r), weight_format::nf4);
    const Tensor bias = random_tensor({s.out}, r);
    for (std::int64_t rows : {1, 8, 11}) {
      const Tensor x = random_tensor({rows, s.in}, r);
      for (bool with_bias : {false, true}) {
        CAPTURE(s.in);
        CAPTURE(rows);
        CAPTURE(with_bias);
        Tensor want = filled({rows, s.out}, NAN);
        be.linear_nf4(x, w.q, w.scale, with_bias ? &bias : nullptr, want);
        Tensor got = filled({rows, s.out}, NAN);
        const bool vectorised = s.in % 8 == 0;
        const emulated::launch_config cfg{
            static_cast<unsigned>((s.out + cuda::nf4_warps_per_block - 1) / cuda::nf4_warps_per_block), 1,
            32 * cuda::nf4_warps_per_block, 0};
        emulated::launch(&cuda::linear_nf4_kernel, cfg, x.data<float>(), rows, s.in,
                         reinterpret_cast<const std::uint8_t*>(w.q.data<std::int8_t>()), w.scale.data<float>(),
                         with_bias ? bias.data<float>() : nullptr, s.out, nf4_tables_of(), got.data<float>(),
                         vectorised);
        check_close(got, to_double(want), 1e-5, 1e-6 * static_cast<double>(s.in), "emulated linear_nf4");
      }
    }
  }
}
