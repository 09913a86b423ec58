// tests/kernels/cuda_quantized.cpp — the quantised inference weights on a
// real GPU against the CPU backend: NF4 quantisation and dequantisation bit
// for bit, and linear_q8 / linear_nf4 equal to the CPU's for the GEMV rows
// (decode, up to cuda_backend::gemv_rows) and for the rows that dequantise
// once and run the f32 GEMM (prefill). Skips without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "tests/kernels/gpu_tensors.hpp"
#include "tests/support/gpu.hpp"

using namespace corolla;
using namespace kernel_test;
using corolla::testing::gpu_skip_reason;

TEST_CASE("cuda: nf4 quantisation and dequantisation are bit-exact with the cpu") {
  REQUIRE_GPU_OR_SKIP();
  rng r(171);
  for (std::int64_t in : {64, 1024, 100, 37}) {
    CAPTURE(in);
    Tensor w = random_tensor({23, in}, r, -2.0f, 2.0f);
    for (std::int64_t k = 0; k < in; ++k) w.data<float>()[4 * in + k] = 0.0f;  // an all-zero row
    const quantized_weight host = quantize_rows(cpu_backend(), w, weight_format::nf4);
    const quantized_weight dev = quantize_rows(gpu(), up(w), weight_format::nf4);
    CHECK(same_values(down(dev.q), host.q));
    CHECK(same_values(down(dev.scale), host.scale));
    Tensor back = Tensor::empty({23, in}), dback = gpu().empty({23, in});
    cpu_backend().dequantize_nf4(host.q, host.scale, back);
    gpu().dequantize_nf4(dev.q, dev.scale, dback);
    CHECK(same_values(down(dback), back));
  }
}

TEST_CASE("cuda: int8 and nf4 weights give the cpu's linear in the GEMV and in the prefill GEMM") {
  REQUIRE_GPU_OR_SKIP();
  rng r(172);
  for (weight_format f : {weight_format::int8, weight_format::nf4}) {
    for (std::int64_t in : {1024, 100}) {
      const std::int64_t out = 77;
      const quantized_weight host = quantize_rows(cpu_backend(), random_tensor({out, in}, r), f);
      const quantized_weight dev{up(host.q), up(host.scale)};
      const Tensor bias = random_tensor({out}, r);
      for (std::int64_t rows : {1, 8, 16, 17, 40}) {
        CAPTURE(weight_format_name(f));
        CAPTURE(in);
        CAPTURE(rows);
        const Tensor x = random_tensor({rows, in}, r);
        Tensor want = Tensor::empty({rows, out});
        linear_as(cpu_backend(), f, x, host.q, host.scale, &bias, want);
        Tensor got = gpu().empty({rows, out});
        const Tensor dbias = up(bias);
        linear_as(gpu(), f, up(x), dev.q, dev.scale, &dbias, got);
        check_close(to_double(down(got)), to_double(want), 1e-5, 1e-6 * static_cast<double>(in), "quantised linear");
      }
    }
  }
}
