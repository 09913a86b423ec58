// tests/kernels/decode_isa_paths.hpp — run a check once per vector ISA the
// CPU's int8 and nf4 decode kernels choose between (kernels/cpu/cpu_isa.hpp).
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

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

}  // namespace kernel_test
