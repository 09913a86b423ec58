// tests/cuda_emulated/linear_q8.cpp — the int8-weight GEMV
// (kernels/cuda/linear_q8_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as linear_q8.cu launches it, against the
// CPU backend's linear_q8 with the same weight: both sum exact products of
// f32 activations and int8 weights in f32, then scale, so only the
// summation order differs. Covers the 16-byte path (in % 16 == 0) and the
// scalar one, one and several passes of 8 rows, a partial block of output
// channels, with and without bias.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernel.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/linear_q8_kernels.cuh"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("emulated int8-weight GEMV equals the cpu's linear_q8") {
  Backend& be = cpu_backend();
  rng r(31);
  struct sizes {
    std::int64_t in, out;
  };
  for (sizes s : {sizes{64, 19}, sizes{48, 8}, sizes{37, 11}}) {
    const Tensor w = random_tensor({s.out, s.in}, r);
    Tensor q = Tensor::empty({s.out, s.in}, dtype::i8), scale = Tensor::empty({s.out});
    Tensor flat_q = q.view({s.out * s.in});
    be.quantize_int8(w.view({s.out * s.in}), static_cast<int>(s.in), flat_q, scale);
    const Tensor bias = random_tensor({s.out}, r);
    for (std::int64_t rows : {1, 8, 11}) {
      const Tensor x = random_tensor({rows, s.in}, r);
      for (bool with_bias : {false, true}) {
        CAPTURE(s.in);
        CAPTURE(rows);
        CAPTURE(with_bias);
        Tensor want = filled({rows, s.out}, NAN);
        be.linear_q8(x, q, scale, with_bias ? &bias : nullptr, want);
        Tensor got = filled({rows, s.out}, NAN);
        const bool vectorised = s.in % 16 == 0;
        const emulated::launch_config cfg{
            static_cast<unsigned>((s.out + cuda::q8_warps_per_block - 1) / cuda::q8_warps_per_block), 1,
            32 * cuda::q8_warps_per_block, 0};
        emulated::launch(&cuda::linear_q8_kernel, cfg, x.data<float>(), rows, s.in, q.data<std::int8_t>(),
                         scale.data<float>(), with_bias ? bias.data<float>() : nullptr, s.out, got.data<float>(),
                         vectorised);
        check_close(got, to_double(want), 1e-5, 1e-6 * static_cast<double>(s.in), "emulated linear_q8");
      }
    }
  }
}
