// tests/kernels/decode_isa_paths.hpp — run a check once per vector ISA the
// CPU's int8 and nf4 decode kernels choose between (kernels/cpu/cpu_isa.hpp),
// and the check every quantised linear shares: against f32 linear on the
// weight it dequantises to.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_isa.hpp"

namespace kernel_test {

/// Runs `body` once per vector ISA the CPU's int8 and nf4 decode kernels
/// can use here (the build's, then AVX-512 where the CPU has it), with the
/// kernels limited to it; the previous limit is restored afterwards.
inline void for_each_decode_isa(const std::function<void(const char*)>& body) {
  using corolla::cpu::vector_isa;
  std::vector<vector_isa> isas{vector_isa::compiled};
  if (corolla::cpu::cpu_has_avx512()) isas.push_back(vector_isa::avx512);
  const vector_isa before = corolla::cpu::limit_vector_isa(vector_isa::compiled);
  struct restore {
    vector_isa cap;
    ~restore() { corolla::cpu::limit_vector_isa(cap); }
  } restore_after{before};
  for (vector_isa isa : isas) {
    corolla::cpu::limit_vector_isa(isa);
    REQUIRE(corolla::cpu::decode_isa() == isa);
    const std::string isa_name = corolla::cpu::isa_name(isa);
    CAPTURE(isa_name);
    body(isa_name.c_str());
  }
}

/// A weight quantised by the format under test: the f32 values it stands
/// for, and the format's linear, y = x @ w^T (+ bias).
struct quantised_linear {
  corolla::Tensor dequantised;
  std::function<void(const corolla::Tensor& x, const corolla::Tensor* bias, corolla::Tensor& y)> linear;
};

/// For each [out, in] of `sizes`: a random weight quantised by `quantise`
/// and a random bias; on every decode ISA, for each of `row_counts`, with
/// and without the bias, its linear equals the CPU's f32 linear on the
/// dequantised weight to f32 rounding (the same products summed in another
/// order; `what` names it in failures).
inline void check_quantised_linear(rng& r, std::initializer_list<std::pair<std::int64_t, std::int64_t>> sizes,
                                   const std::function<quantised_linear(const corolla::Tensor& w)>& quantise,
                                   const char* what,
                                   std::initializer_list<std::int64_t> row_counts = {1, 3, 8, 9, 40}) {
  corolla::Backend& be = corolla::cpu_backend();
  for (const auto& [out, in] : sizes) {
    const corolla::Tensor w = random_tensor({out, in}, r);
    const quantised_linear q = quantise(w);
    const corolla::Tensor bias = random_tensor({out}, r);
    for_each_decode_isa([&](const char*) {
      for (std::int64_t rows : row_counts) {
        const corolla::Tensor x = random_tensor({rows, in}, r);
        for (bool with_bias : {false, true}) {
          CAPTURE(in);
          CAPTURE(out);
          CAPTURE(rows);
          CAPTURE(with_bias);
          const corolla::Tensor* b = with_bias ? &bias : nullptr;
          corolla::Tensor want = filled({rows, out}, std::nanf(""));
          be.linear(x, q.dequantised, b, want);
          corolla::Tensor got = filled({rows, out}, std::nanf(""));
          q.linear(x, b, got);
          check_close(got, to_double(want), 1e-5, 1e-6 * static_cast<double>(in), what);
        }
      }
    });
  }
}

}  // namespace kernel_test
