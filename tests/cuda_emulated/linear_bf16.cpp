// tests/cuda_emulated/linear_bf16.cpp — the bf16-weight GEMV of decode
// (kernels/cuda/linear_bf16_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as linear_bf16.cu launches it, against the
// CPU backend's linear with the same bf16 weight: both sum exact products
// of f32 activations and bf16 weights in f32, so only the summation order
// differs (rtol 1e-5). Covers the 16-byte path (in % 8 == 0, with a tail
// after the four-load unroll) and the scalar one, one and several passes of
// 8 rows, partial blocks of 8 output features, with and without bias.
// tests/kernels/linear_bf16.cpp and cuda_ops.cpp check it on a GPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernel.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/linear_bf16_kernels.cuh"

using namespace corolla;

TEST_CASE("emulated bf16-weight GEMV matches the cpu's linear (16-byte and scalar paths, 1 to 19 rows)") {
  kernel_test::rng r(311);
  struct shape {
    std::int64_t rows, in, out;
    bool bias;
  };
  for (const shape& c : {shape{1, 256, 40, true}, shape{3, 1288, 17, false}, shape{19, 264, 9, true},
                         shape{2, 100, 11, true}, shape{8, 36, 8, false}}) {
    CAPTURE(c.rows);
    CAPTURE(c.in);
    CAPTURE(c.out);
    const Tensor x = kernel_test::random_tensor({c.rows, c.in}, r);
    const Tensor w = kernel_test::random_tensor({c.out, c.in}, r).to(dtype::bf16);
    const Tensor b = kernel_test::random_tensor({c.out}, r);
    Tensor want = Tensor::empty({c.rows, c.out});
    cpu_backend().linear(x, w, c.bias ? &b : nullptr, want);

    std::vector<float> got(static_cast<std::size_t>(c.rows * c.out), NAN);
    const bool vectorised = c.in % 8 == 0;  // the launcher's choice (the tensors here are 64-byte aligned)
    const emulated::launch_config cfg{
        static_cast<unsigned>((c.out + cuda::warps_per_block - 1) / cuda::warps_per_block), 1,
        32 * cuda::warps_per_block, 0};
    const float* bias = c.bias ? b.data<float>() : nullptr;
    const auto* wp = static_cast<const std::uint16_t*>(w.raw());
    if (vectorised)
      emulated::launch(&cuda::linear_bf16_kernel<true>, cfg, x.data<float>(), c.rows, c.in, wp, c.out, bias,
                       got.data());
    else
      emulated::launch(&cuda::linear_bf16_kernel<false>, cfg, x.data<float>(), c.rows, c.in, wp, c.out, bias,
                       got.data());
    std::vector<double> g(got.begin(), got.end());
    kernel_test::check_close(g, kernel_test::to_double(want), 1e-5, 1e-5,
                             std::string("linear_bf16 ") + (vectorised ? "16-byte" : "scalar") + " path");
  }
}
