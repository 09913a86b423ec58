// tests/cuda_emulated/linear_bf16.cpp — the bf16-weight GEMV of decode
// (kernels/cuda/linear_bf16_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as linear_bf16.cu launches it, against the
// CPU backend's linear with the same bf16 weight: both sum exact products
// of f32 activations and bf16 weights in f32, so only the summation order
// differs (rtol 1e-5). Covers the 16-byte path (in % 8 == 0, with rows
// that are and are not whole batches of loads) and the scalar one, one and
// several passes of rows, partial blocks of output features, with and
// without bias. Every launch variant must equal the default bit for bit
// (the tuner's choice may not change what decode computes), and none may
// read x, which the kernel before it writes, before await_producers().
// tests/kernels/linear_bf16.cpp and cuda_ops.cpp check it on a GPU.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernel.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/linear_bf16_kernels.cuh"

using namespace corolla;

namespace {

/// Runs `kernel` as linear_bf16.cu launches it (`warps` outputs per block)
/// with x declared the previous kernel's output.
std::vector<float> run_gemv(cuda::gemv_kernel kernel, int warps, const Tensor& x, std::int64_t rows,
                            std::int64_t in, const Tensor& w, std::int64_t out, const float* bias) {
  std::vector<float> got(static_cast<std::size_t>(rows * out), NAN);
  const emulated::launch_config cfg{static_cast<unsigned>((out + warps - 1) / warps), 1,
                                    32 * static_cast<unsigned>(warps), 0};
  emulated::produced = {{x.raw(), x.nbytes()}};
  emulated::launch(kernel, cfg, x.data<float>(), rows, in, static_cast<const std::uint16_t*>(w.raw()), out, bias,
                   got.data());
  emulated::produced.clear();
  return got;
}

}  // namespace

TEST_CASE("emulated bf16-weight GEMV: every launch variant matches the cpu's linear and the default bit for bit") {
  kernel_test::rng r(311);
  struct shape {
    std::int64_t rows, in, out;
    bool bias;
  };
  // in = 4104: 16 loads per lane and a tail of one (the 16-load variant's
  // predicated last batch); 1288: five loads and a tail; 256: one load.
  for (const shape& c : {shape{1, 256, 40, true}, shape{1, 4104, 9, false}, shape{1, 1288, 13, true},
                         shape{3, 1288, 17, false}, shape{19, 264, 9, true}, shape{2, 100, 11, true},
                         shape{8, 36, 8, false}}) {
    CAPTURE(c.rows);
    CAPTURE(c.in);
    CAPTURE(c.out);
    const Tensor x = kernel_test::random_tensor({c.rows, c.in}, r);
    const Tensor w = kernel_test::random_tensor({c.out, c.in}, r).to(dtype::bf16);
    const Tensor b = kernel_test::random_tensor({c.out}, r);
    Tensor want = Tensor::empty({c.rows, c.out});
    cpu_backend().linear(x, w, c.bias ? &b : nullptr, want);
    const float* bias = c.bias ? b.data<float>() : nullptr;

    if (c.in % 8 != 0) {  // the launcher's choice (the tensors here are 64-byte aligned)
      const std::vector<float> got = run_gemv(cuda::gemv_scalar, cuda::scalar_warps, x, c.rows, c.in, w, c.out, bias);
      kernel_test::check_close(std::vector<double>(got.begin(), got.end()), kernel_test::to_double(want), 1e-5,
                               1e-5, "linear_bf16 scalar path");
      continue;
    }
    std::vector<float> first;
    for (const cuda::gemv_variant& v : cuda::gemv_variants) {
      CAPTURE(std::string(v.name));
      const std::vector<float> got = run_gemv(v.kernel, v.warps, x, c.rows, c.in, w, c.out, bias);
      kernel_test::check_close(std::vector<double>(got.begin(), got.end()), kernel_test::to_double(want), 1e-5,
                               1e-5, std::string("linear_bf16 ") + v.name);
      if (first.empty())
        first = got;
      else
        CHECK(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)) == 0);
    }
  }
}
