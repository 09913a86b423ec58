// tests/cuda_emulated/linear_bf16.cpp — the bf16-weight GEMV of decode
// (kernels/cuda/linear_bf16_*.cuh), compiled as host C++ against
// cuda_emulation.hpp and launched as linear_bf16.cu launches it, against the
// CPU backend's linear with the same bf16 weight: both sum exact products
// of f32 activations and bf16 weights in f32, so only the summation order
// differs (rtol 1e-5). Covers the 16-byte path (in % 8 == 0, with rows
// that are and are not whole batches of loads) and the scalar one, one and
// several passes of rows, partial blocks of output features, with and
// without bias. Every launch variant (the register kernels, the cp.async
// one, whose copies the emulation performs only at their wait, and the
// split one, two warps to an output) must equal the default bit for bit
// (the tuner's choice may not change what decode computes), none may read
// x or the residual, which the kernel before it writes, before
// await_producers(), and each fused epilogue (residual add, GELU, SwiGLU of
// a stacked gate/up weight) must equal the plain GEMV followed by the
// elementwise kernels' own expression, bit for bit; so must the q/k/v
// product with RoPE and the cache append as its epilogue
// (linear_bf16_rope_kv_kernel) equal the plain GEMV followed by
// rope_store_kv_kernel, in every cache type, with and without rotation.
// tests/kernels/linear_bf16.cpp and cuda_products.cpp check it on a GPU.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/kernels/kernel_test_util.hpp"
// Last: the emulation's macros must reach only the kernel.
#include "tests/cuda_emulated/cuda_emulation.hpp"
#include "kernels/cuda/linear_bf16_rope_kv_kernels.cuh"
#include "kernels/cuda/linear_bf16_variants.cuh"

using namespace corolla;

namespace {

/// A launch of a GEMV kernel: grid, warps per block, dynamic shared memory.
struct gemv_launch {
  cuda::gemv_kernel kernel;
  std::int64_t blocks;
  int warps;
  std::size_t smem;
};

/// Variant i with epilogue E, launched as linear_bf16.cu launches it for
/// `out` outputs.
template <cuda::gemv_epilogue E = cuda::gemv_epilogue::bias>
gemv_launch variant_launch(int i, std::int64_t out) {
  const cuda::gemv_variant& v = cuda::gemv_variants[i];
  return {cuda::gemv_kernel_for<E>(i), cuda::gemv_blocks(v, out), v.warps, cuda::gemv_smem_bytes(v)};
}

/// The scalar kernel with epilogue E for `out` outputs.
template <cuda::gemv_epilogue E = cuda::gemv_epilogue::bias>
gemv_launch scalar_launch(std::int64_t out) {
  return {cuda::gemv_scalar<E>, (out + cuda::scalar_warps - 1) / cuda::scalar_warps, cuda::scalar_warps, 0};
}

/// Runs launch l with x and the residual declared the previous kernel's
/// output.
std::vector<float> run_gemv(const gemv_launch& l, const Tensor& x, std::int64_t rows, std::int64_t in,
                            const Tensor& w, std::int64_t out, const float* bias,
                            const std::vector<float>* residual = nullptr) {
  std::vector<float> got(static_cast<std::size_t>(rows * out), NAN);
  const emulated::launch_config cfg{static_cast<unsigned>(l.blocks), 1, 32 * static_cast<unsigned>(l.warps), l.smem};
  emulated::produced = {{x.raw(), x.nbytes()}};
  if (residual) emulated::produced.push_back({residual->data(), residual->size() * sizeof(float)});
  emulated::launch(l.kernel, cfg, x.data<float>(), rows, in, static_cast<const std::uint16_t*>(w.raw()), out, bias,
                   residual ? residual->data() : nullptr, got.data());
  emulated::produced.clear();
  return got;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("emulated bf16-weight GEMV: every launch variant matches the cpu's linear and the default bit for bit") {
  kernel_test::rng r(311);
  struct shape {
    std::int64_t rows, in, out;
    bool bias;
  };
  // in = 4104: 16 loads per lane and a tail of one (the 16-load variant's
  // predicated last batch, and one class with a load more than the other);
  // 1288: five loads and a tail; 256: one load (the split kernels' second
  // warp has none). Outputs that leave the last block part empty; 12, 16
  // and 19 rows: two and three passes of the eight-row kernel.
  // 1800: seven loads on most lanes (a batch of four and three), eight on lane 0.
  for (const shape& c : {shape{1, 256, 40, true}, shape{1, 4104, 9, false}, shape{1, 1288, 13, true},
                         shape{1, 1800, 6, true}, shape{4, 1800, 11, false},
                         shape{3, 1288, 17, false}, shape{12, 1288, 7, true}, shape{16, 264, 5, false},
                         shape{19, 264, 9, true}, shape{2, 100, 11, true}, shape{8, 36, 8, false}}) {
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
      const std::vector<float> got = run_gemv(scalar_launch(c.out), x, c.rows, c.in, w, c.out, bias);
      kernel_test::check_close(std::vector<double>(got.begin(), got.end()), kernel_test::to_double(want), 1e-5,
                               1e-5, "linear_bf16 scalar path");
      continue;
    }
    std::vector<float> first;
    for (int i = 0; i < cuda::gemv_variant_count; ++i) {
      const cuda::gemv_variant& v = cuda::gemv_variants[i];
      CAPTURE(std::string(v.name));
      const std::vector<float> got = run_gemv(variant_launch(i, c.out), x, c.rows, c.in, w, c.out, bias);
      kernel_test::check_close(std::vector<double>(got.begin(), got.end()), kernel_test::to_double(want), 1e-5,
                               1e-5, std::string("linear_bf16 ") + v.name);
      if (first.empty())
        first = got;
      else
        CHECK(same_bits(got, first));
    }
  }
}

TEST_CASE("emulated bf16-weight GEMV epilogues equal linear then add, gelu or swiglu, bit for bit") {
  kernel_test::rng r(312);
  using cuda::gemv_epilogue;
  // 11 rows: a second pass of the eight-row kernel; in = 100: the scalar kernel.
  for (auto [rows, in] : {std::pair<std::int64_t, std::int64_t>{1, 1032}, {3, 264}, {11, 264}, {2, 100}}) {
    CAPTURE(rows);
    CAPTURE(in);
    const std::int64_t out = 21;
    const Tensor x = kernel_test::random_tensor({rows, in}, r);
    const Tensor w = kernel_test::random_tensor({2 * out, in}, r, -0.2f, 0.2f).to(dtype::bf16);
    const Tensor w_half = w.slice(0, out);  // the first `out` rows, for add and gelu
    const Tensor b = kernel_test::random_tensor({out}, r);
    std::vector<float> residual(static_cast<std::size_t>(rows * out));
    for (float& v : residual) v = r.uniform();
    const bool vectorised = in % 8 == 0;
    // variant i of epilogue E (the scalar kernel where the launcher takes it)
    auto run = [&](auto e, int i, const Tensor& wt, std::int64_t n, const float* bias, const std::vector<float>* res) {
      constexpr gemv_epilogue E = decltype(e)::value;
      return run_gemv(vectorised ? variant_launch<E>(i, n) : scalar_launch<E>(n), x, rows, in, wt, n, bias, res);
    };
    using bias_e = std::integral_constant<gemv_epilogue, gemv_epilogue::bias>;
    using residual_e = std::integral_constant<gemv_epilogue, gemv_epilogue::residual>;
    using gelu_e = std::integral_constant<gemv_epilogue, gemv_epilogue::gelu>;
    using swiglu_e = std::integral_constant<gemv_epilogue, gemv_epilogue::swiglu>;
    // The unfused ops: the plain GEMV, then what the elementwise kernels do
    // (the same device functions; add is residual + t).
    const std::vector<float> plain = run(bias_e{}, 0, w_half, out, b.data<float>(), nullptr);
    const std::vector<float> stacked = run(bias_e{}, 0, w, 2 * out, nullptr, nullptr);
    std::vector<float> added(plain.size()), gelued(plain.size()), swiglued(plain.size());
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t o = 0; o < out; ++o) {
        const auto at = static_cast<std::size_t>(row * out + o);
        added[at] = residual[at] + plain[at];
        gelued[at] = cuda::gelu_tanh(plain[at]);
        swiglued[at] = cuda::silu_times(stacked[static_cast<std::size_t>(row * 2 * out + o)],
                                        stacked[static_cast<std::size_t>(row * 2 * out + out + o)]);
      }
    for (int i = 0; i < (vectorised ? cuda::gemv_variant_count : 1); ++i) {
      CAPTURE(i);
      CHECK(same_bits(run(residual_e{}, i, w_half, out, b.data<float>(), &residual), added));
      CHECK(same_bits(run(gelu_e{}, i, w_half, out, b.data<float>(), nullptr), gelued));
      CHECK(same_bits(run(swiglu_e{}, i, w, out, nullptr, nullptr), swiglued));
    }
    // and the composition matches the cpu's ops
    Tensor lin = Tensor::empty({rows, out}), g = Tensor::empty({rows, out});
    cpu_backend().linear(x, w_half, &b, lin);
    cpu_backend().gelu(lin, g);
    kernel_test::check_close(std::vector<double>(gelued.begin(), gelued.end()), kernel_test::to_double(g), 1e-5,
                             1e-5, "fused gelu against the cpu");
  }
}

namespace {

/// The GEMV then rope_store_kv_kernel (the unfused decode step), and the
/// fused kernel, with cache rows of type KT; x is the previous kernel's
/// output. Returns {q, k row, v row} of each as bytes.
template <class KT>
std::pair<std::vector<std::vector<unsigned char>>, std::vector<std::vector<unsigned char>>> rope_kv_both(
    const Tensor& x, std::int64_t in, const Tensor& w, const float* bias, int hq, int hkv, int dh,
    const std::int32_t* position, const rope_spec& spec, bool rotate) {
  const std::int64_t qw = std::int64_t{hq} * dh, kw = std::int64_t{hkv} * dh, rows_w = qw + 2 * kw;
  auto bytes = [](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    return std::vector<unsigned char>(b, b + n);
  };
  const std::size_t row_bytes = static_cast<std::size_t>(kw) * sizeof(KT);
  // Unfused: the plain GEMV into the stacked row, then the store kernel.
  std::vector<float> qkv = run_gemv(variant_launch(0, rows_w), x, 1, in, w, rows_w, bias);
  std::vector<KT> k_row(static_cast<std::size_t>(kw)), v_row(static_cast<std::size_t>(kw));
  emulated::produced = {{qkv.data(), qkv.size() * sizeof(float)}};
  emulated::launch(&cuda::rope_store_kv_kernel<KT>, {3, 1, 64, 0}, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw,
                   position, std::int64_t{1}, hq, hkv, dh, spec, rotate, k_row.data(), v_row.data());
  emulated::produced.clear();
  std::vector<std::vector<unsigned char>> unfused = {bytes(qkv.data(), static_cast<std::size_t>(qw) * sizeof(float)),
                                                     bytes(k_row.data(), row_bytes), bytes(v_row.data(), row_bytes)};
  // Fused: one launch, as linear_bf16_rope_kv launches it.
  std::vector<float> q(static_cast<std::size_t>(qw), NAN);
  std::vector<KT> k_fused(static_cast<std::size_t>(kw)), v_fused(static_cast<std::size_t>(kw));
  const cuda::rope_kv_rows<KT> d{q.data(), position, hq, hkv, dh, spec, rotate, k_fused.data(), v_fused.data()};
  const std::int64_t pairs = rows_w / 2;
  const emulated::launch_config cfg{static_cast<unsigned>((pairs + cuda::rope_kv_warps - 1) / cuda::rope_kv_warps), 1,
                                    32 * cuda::rope_kv_warps, 0};
  // x, the bias and the position as an earlier kernel's output (the
  // emulation checks the __ldg reads: x and the bias).
  emulated::produced = {{x.raw(), x.nbytes()}, {position, sizeof(std::int32_t)}};
  if (bias) emulated::produced.push_back({bias, static_cast<std::size_t>(rows_w) * sizeof(float)});
  emulated::launch(&cuda::linear_bf16_rope_kv_kernel<cuda::rope_kv_unroll, cuda::rope_kv_warps, KT>, cfg,
                   x.data<float>(), in, static_cast<const std::uint16_t*>(w.raw()), bias, d);
  emulated::produced.clear();
  return {unfused, {bytes(q.data(), q.size() * sizeof(float)), bytes(k_fused.data(), row_bytes),
                    bytes(v_fused.data(), row_bytes)}};
}

}  // namespace

TEST_CASE("emulated q/k/v GEMV with RoPE and the cache append as its epilogue equals the GEMV then rope_store_kv") {
  kernel_test::rng r(313);
  const int hq = 4, hkv = 2, dh = 16;  // grouped queries: 2 q heads per kv head
  const std::int64_t rows_w = (hq + 2 * hkv) * dh;
  const std::int32_t position = 4093;
  rope_spec scaled(500000.0);  // YaRN: scaled frequencies, and cos and sin scaled too
  scaled.kind = rope_kind::yarn;
  scaled.factor = 4.0;
  scaled.ramp_low = 2.0;
  scaled.ramp_high = 6.0;
  scaled.attention_factor = 1.1;
  // in = 264: one load per lane and a tail; 1032: four and a tail; 1800:
  // four and three on most lanes; 2048: two whole batches of four. The product's loads and the epilogue's
  // settings are independent: every setting at 2048, one at the others
  // (each launch costs the emulation a thread per lane).
  for (const std::int64_t in : {std::int64_t{264}, std::int64_t{1032}, std::int64_t{1800}, std::int64_t{2048}}) {
    CAPTURE(in);
    const Tensor x = kernel_test::random_tensor({1, in}, r);
    const Tensor w = kernel_test::random_tensor({rows_w, in}, r, -0.2f, 0.2f).to(dtype::bf16);
    const Tensor b = kernel_test::random_tensor({rows_w}, r);
    const bool every = in == 2048;
    for (const bool with_bias : {true, false})
      for (const bool rotate : {true, false})
        for (const rope_spec& spec : {scaled, rope_spec(10000.0f)}) {
          if (!every && !(with_bias && rotate && spec.kind == rope_kind::yarn)) continue;
          CAPTURE(with_bias);
          CAPTURE(rotate);
          CAPTURE(static_cast<int>(spec.kind));
          const float* bias = with_bias ? b.data<float>() : nullptr;
          const auto f32 = rope_kv_both<float>(x, in, w, bias, hq, hkv, dh, &position, spec, rotate);
          CHECK(f32.first == f32.second);
          const auto bf16 = rope_kv_both<__nv_bfloat16>(x, in, w, bias, hq, hkv, dh, &position, spec, rotate);
          CHECK(bf16.first == bf16.second);
          const auto f16 = rope_kv_both<__half>(x, in, w, bias, hq, hkv, dh, &position, spec, rotate);
          CHECK(f16.first == f16.second);
          // and the composition matches the cpu's linear and rope_store_kv
          const std::int64_t qw = std::int64_t{hq} * dh, kw = std::int64_t{hkv} * dh;
          Tensor lin = Tensor::empty({1, rows_w});
          cpu_backend().linear(x, w, with_bias ? &b : nullptr, lin);
          const Tensor all = lin.view({rows_w});
          Tensor q = all.slice(0, qw).view({1, qw}).clone(), k = all.slice(qw, qw + kw).view({1, kw}).clone();
          Tensor k_row = Tensor::empty({1, kw}), v_row = Tensor::empty({1, kw});
          cpu_backend().rope_store_kv(q, k, all.slice(qw + kw, rows_w).view({1, kw}),
                                      Tensor::from_i32(std::vector<std::int32_t>{position}, {1}), hq, hkv, dh, spec, rotate, k_row.raw(),
                                      v_row.raw(), dtype::f32);
          std::vector<float> got_q(static_cast<std::size_t>(qw)), got_k(static_cast<std::size_t>(kw));
          std::memcpy(got_q.data(), f32.second[0].data(), got_q.size() * sizeof(float));
          std::memcpy(got_k.data(), f32.second[1].data(), got_k.size() * sizeof(float));
          kernel_test::check_close(std::vector<double>(got_q.begin(), got_q.end()), kernel_test::to_double(q), 1e-4,
                                   1e-5, "fused q against the cpu");
          kernel_test::check_close(std::vector<double>(got_k.begin(), got_k.end()), kernel_test::to_double(k_row),
                                   1e-4, 1e-5, "fused k row against the cpu");
        }
  }
}
