// tests/cuda_emulated/elementwise_kernels.cpp — the remaining small kernels
// (kernels/cuda/elementwise_kernels.cuh, embedding_kernels.cuh,
// quant_kernels.cuh, convert_kernels.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as their .cu launchers launch them:
//  * SwiGLU, GELU (forward and backward), add and scale in f32 against the
//    CPU backend, and in bf16 and f16 storage against the f32 kernel on the
//    widened inputs, rounded (the arithmetic is f32 either way, so equal);
//  * the sum of squares (per-block f64 partials, then one block) against a
//    double sum; the bias broadcast and the bias-gradient column sums;
//  * the embedding gather and its scatter-add (repeated ids: concurrent
//    atomics) against the CPU backend;
//  * int8 quantisation and dequantisation, bit for bit with the CPU;
//  * f32 <-> bf16 / f16 conversion, bit for bit with the host's
//    (kernels/half.cpp; subnormals, ties, overflow and NaN included).
// tests/kernels/cuda_ops.cpp checks the same on a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/cuda_emulated/emulated_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernels.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/convert_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/quant_kernels.cuh"
#include "tests/cuda_emulated/emulated_column_sums.hpp"

using namespace corolla;
using emulated_test::as;
using emulated_test::f;
using emulated_test::rounded_to;
using kernel_test::check_close;
using kernel_test::random_tensor;
using kernel_test::to_double;

namespace {

constexpr double rel_tol = 1e-6, abs_tol = 1e-7;
/// Two blocks of 64 threads: the grid-stride loops go round.
const emulated::launch_config strided{2, 1, 64, 0};

/// Runs the unary/binary activations in storage type T (host tensors of
/// dtype `dt`) and returns the outputs widened to f32.
template <class T>
std::vector<Tensor> activations(dtype dt, const Tensor& a, const Tensor& b, const Tensor& c) {
  const std::int64_t n = a.numel();
  const Tensor x = a.to(dt), y = b.to(dt), z = c.to(dt);
  std::vector<Tensor> out;
  for (int i = 0; i < 7; ++i) out.push_back(Tensor::empty(a.shape(), dt));
  emulated::launch(&cuda::swiglu_forward_kernel<T>, strided, as<T>(x), as<T>(y), as<T>(out[0]), n);
  emulated::launch(&cuda::swiglu_backward_kernel<T>, strided, as<T>(x), as<T>(y), as<T>(z), as<T>(out[1]),
                   as<T>(out[2]), n);
  emulated::launch(&cuda::gelu_forward_kernel<T>, strided, as<T>(x), as<T>(out[3]), n);
  emulated::launch(&cuda::gelu_backward_kernel<T>, strided, as<T>(x), as<T>(z), as<T>(out[4]), n);
  emulated::launch(&cuda::add_kernel<T>, strided, as<T>(x), as<T>(y), as<T>(out[5]), n);
  out[6].copy_from(x);
  emulated::launch(&cuda::scale_kernel<T>, strided, as<T>(out[6]), -1.5f, n);
  for (Tensor& t : out) t = t.to(dtype::f32);
  return out;
}

}  // namespace

TEST_CASE("emulated activation, add, scale, reduction and bias kernels match the cpu in f32, bf16 and f16") {
  kernel_test::rng r(937);
  const std::int64_t n = 300;
  const Tensor a = random_tensor({n}, r, -3.0f, 3.0f), b = random_tensor({n}, r), c = random_tensor({n}, r);

  // f32 against the CPU backend.
  const std::vector<Tensor> got = activations<float>(dtype::f32, a, b, c);
  std::vector<Tensor> want;
  for (int i = 0; i < 7; ++i) want.push_back(Tensor::empty({n}));
  cpu_backend().swiglu(a, b, want[0]);
  cpu_backend().swiglu_backward(a, b, c, want[1], want[2]);
  cpu_backend().gelu(a, want[3]);
  cpu_backend().gelu_backward(a, c, want[4]);
  cpu_backend().add(a, b, want[5]);
  want[6].copy_from(a);
  cpu_backend().scale(want[6], -1.5f);
  const char* names[] = {"swiglu", "swiglu dgate", "swiglu dup", "gelu", "gelu dx", "add", "scale"};
  for (int i = 0; i < 7; ++i) check_close(got[static_cast<std::size_t>(i)], to_double(want[static_cast<std::size_t>(i)]), 1e-5, 1e-6, names[i]);

  // 16-bit storage: the f32 kernels on the widened inputs, rounded.
  auto check_storage = [&](dtype dt, const std::vector<Tensor>& narrow) {
    const Tensor wa = a.to(dt).to(dtype::f32), wb = b.to(dt).to(dtype::f32), wc = c.to(dt).to(dtype::f32);
    const std::vector<Tensor> ref = activations<float>(dtype::f32, wa, wb, wc);
    for (int i = 0; i < 7; ++i)
      check_close(narrow[static_cast<std::size_t>(i)], rounded_to(ref[static_cast<std::size_t>(i)], dt), 0, 0,
                  std::string(names[i]) + " in " + dtype_name(dt));
  };
  check_storage(dtype::bf16, activations<__nv_bfloat16>(dtype::bf16, a, b, c));
  check_storage(dtype::f16, activations<__half>(dtype::f16, a, b, c));

  // Sum of squares: f64 partials per chunk of 4096, then one block over them.
  const std::int64_t big = 2 * cuda::sum_squares_chunk + 123;
  const Tensor x = random_tensor({big}, r);
  const std::int64_t chunks = (big + cuda::sum_squares_chunk - 1) / cuda::sum_squares_chunk;
  std::vector<double> partials(static_cast<std::size_t>(chunks), NAN);
  double total = NAN;
  emulated::launch(&cuda::sum_squares_partial_kernel<float>,
                   {static_cast<unsigned>(chunks), 1, cuda::sum_squares_threads, 0}, f(x), big, partials.data());
  emulated::launch(&cuda::sum_partials_kernel, {1, 1, 256, 0}, static_cast<const double*>(partials.data()), chunks,
                   &total);
  double exact = 0;
  for (const float v : x.to_vector()) exact += static_cast<double>(v) * v;
  CHECK(std::fabs(total - exact) <= 1e-12 * exact);
  CHECK(std::fabs(total - cpu_backend().sum_squares(x)) <= 1e-12 * exact);

  // Bias: broadcast over rows, and the gradient's column sums added to bf16 and f32 accumulators.
  const std::int64_t rows = 40, cols = 37;
  const Tensor bias = random_tensor({cols}, r), dy = random_tensor({rows, cols}, r);
  Tensor out = Tensor::empty({rows, cols});
  emulated::launch(&cuda::broadcast_rows_kernel<float, float>, strided, f(bias), f(out), rows, cols);
  for (std::int64_t i = 0; i < rows; ++i) CHECK(kernel_test::same_values(out.slice(i, i + 1).view({cols}), bias));
  std::vector<double> sums(static_cast<std::size_t>(cols), 0.5);
  const std::vector<float> g = dy.to_vector();
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) sums[static_cast<std::size_t>(j)] += g[static_cast<std::size_t>(i * cols + j)];
  // One chunk of rows, and three (16, 16 and 8 rows: partial sums, then
  // column_partials_kernel); a bf16 accumulator gets the f32 one's sum
  // rounded once.
  for (const std::int64_t chunk_rows : {rows, std::int64_t{16}}) {
    CAPTURE(chunk_rows);
    Tensor acc = kernel_test::filled({cols}, 0.5f), acc16 = kernel_test::filled({cols}, 0.5f).to(dtype::bf16);
    emulated_test::launch_column_sums<1>(&cuda::column_sum_kernel<float, float>, rows, cols, chunk_rows, {f(acc)},
                                         f(dy), rows, cols);
    check_close(acc, sums, 1e-5, 1e-6, "bias column sums");
    emulated_test::launch_column_sums<1>(&cuda::column_sum_kernel<float, __nv_bfloat16>, rows, cols, chunk_rows,
                                         {as<__nv_bfloat16>(acc16)}, f(dy), rows, cols);
    check_close(acc16.to(dtype::f32), rounded_to(acc, dtype::bf16), 0, 0, "bias column sums into bf16");
  }
}

TEST_CASE("column sums split rows into chunks of 256, more a chunk only past 65535 chunks, or keep all rows in one") {
  CHECK(cuda::column_chunk_rows_for(1) == 256);
  CHECK(cuda::column_chunks(256, 256) == 1);
  CHECK(cuda::column_chunks(257, 256) == 2);
  CHECK(cuda::column_chunks(4096, 256) == 16);
  CHECK(cuda::column_partials_bytes(256, 100, 2) == 0);  // one chunk: no partials
  CHECK(cuda::column_partials_bytes(4096, 100, 2) == 16 * 2 * 100 * sizeof(float));
  const std::int64_t most = std::int64_t{65535} * 256;
  CHECK(cuda::column_chunk_rows_for(most) == 256);
  CHECK(cuda::column_chunks(most, 256) == 65535);
  CHECK(cuda::column_chunk_rows_for(most + 1) == 257);
  CHECK(cuda::column_chunks(most + 1, 257) <= 65535);
  const std::int64_t huge = std::int64_t{1} << 34;
  CHECK(cuda::column_chunks(huge, cuda::column_chunk_rows_for(huge)) <= 65535);
  // Not chunked (COROLLA_CUDA_COLUMN_CHUNKS=0): one chunk of every row, no partials.
  for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{257}, std::int64_t{4096}, huge}) {
    CAPTURE(rows);
    CHECK(cuda::column_chunk_rows_for(rows, false) == rows);
    CHECK(cuda::column_chunks(rows, cuda::column_chunk_rows_for(rows, false)) == 1);
    CHECK(cuda::column_partials_bytes(rows, 100, 2, false) == 0);
  }
  CHECK(cuda::column_chunk_rows_for(0, false) == 1);
}

TEST_CASE("emulated embedding, int8 quantisation and dtype conversion kernels match the cpu") {
  kernel_test::rng r(941);
  // Gather and scatter-add, with ids repeated so the atomics collide.
  const std::int64_t vocab = 11, d = 24, n = 30;
  std::vector<std::int32_t> ids;
  for (std::int64_t i = 0; i < n; ++i) ids.push_back(static_cast<std::int32_t>((i * 7) % 5));
  const Tensor idt = Tensor::from_i32(ids, {n});
  const Tensor table = random_tensor({vocab, d}, r), dout = random_tensor({n, d}, r);
  Tensor out = Tensor::empty({n, d}), want = Tensor::empty({n, d});
  cpu_backend().embedding(idt, table, want);
  emulated::launch(&cuda::embedding_forward_kernel<float>, strided, ids.data(), f(table), f(out), n, d);
  CHECK(kernel_test::same_values(out, want));
  Tensor dtable = kernel_test::filled({vocab, d}, 0.25f), want_dtable = kernel_test::filled({vocab, d}, 0.25f);
  cpu_backend().embedding_backward(idt, dout, want_dtable);
  emulated::launch(&cuda::embedding_backward_kernel, strided, ids.data(), f(dout), f(dtable), n, d);
  check_close(dtable, to_double(want_dtable), 1e-5, 1e-6, "embedding scatter-add");

  // int8 blocks of 64 with a partial last block and an all-zero block.
  const std::int64_t count = 64 * 3 + 17;
  Tensor x = random_tensor({count}, r, -2.0f, 2.0f);
  for (std::int64_t i = 64; i < 128; ++i) x.data<float>()[i] = 0.0f;
  const std::int64_t blocks = (count + 63) / 64;
  Tensor q = Tensor::empty({count}, dtype::i8), scales = Tensor::empty({blocks});
  Tensor want_q = Tensor::empty({count}, dtype::i8), want_scales = Tensor::empty({blocks});
  cpu_backend().quantize_int8(x, 64, want_q, want_scales);
  emulated::launch(&cuda::quantize_kernel, {static_cast<unsigned>(blocks), 1, cuda::quant_threads, 0}, f(x), count, 64,
                   static_cast<std::int8_t*>(q.raw()), f(scales));
  CHECK(kernel_test::same_values(q, want_q));
  CHECK(kernel_test::same_values(scales, want_scales));
  Tensor back = Tensor::empty({count}), want_back = Tensor::empty({count});
  cpu_backend().dequantize_int8(want_q, want_scales, 64, want_back);
  emulated::launch(&cuda::dequantize_kernel, strided, static_cast<const std::int8_t*>(q.raw()), f(scales), count, 64,
                   f(back));
  CHECK(kernel_test::same_values(back, want_back));

  // Conversions, including the values rounding is easiest to get wrong.
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f,
                          std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.5f, -25), std::ldexp(1.0f, -25),
                          std::ldexp(3.0f, -26), 1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11),
                          1.0f + std::ldexp(1.0f, -8), 3.4e38f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 200; ++i) v.push_back(r.uniform(-100.0f, 100.0f));
  const Tensor src = Tensor::from_f32(v, {static_cast<std::int64_t>(v.size())});
  const auto len = src.numel();
  auto check_dtype = [&](dtype dt, auto tag) {
    using T = decltype(tag);
    Tensor narrow = Tensor::empty(src.shape(), dt), wide = Tensor::empty(src.shape());
    emulated::launch(&cuda::convert_kernel<float, T>, strided, f(src), as<T>(narrow), len);
    CHECK_MESSAGE(kernel_test::same_values(narrow, src.to(dt)), "f32 -> " << dtype_name(dt));
    emulated::launch(&cuda::convert_kernel<T, float>, strided, static_cast<const T*>(as<T>(narrow)), f(wide), len);
    CHECK_MESSAGE(kernel_test::same_values(wide, narrow.to(dtype::f32)), dtype_name(dt) << " -> f32");
  };
  check_dtype(dtype::bf16, __nv_bfloat16{});
  check_dtype(dtype::f16, __half{});
}
