// kernels/cpu/cpu_isa.cpp — see cpu_isa.hpp.
#include "kernels/cpu/cpu_isa.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace corolla::cpu {
namespace {

/// The cap COROLLA_CPU_ISA sets: "avx2" (or "compiled") keeps the kernels on
/// the build's instructions; anything else leaves the choice to the CPU.
vector_isa cap_from_environment() {
  const char* v = std::getenv("COROLLA_CPU_ISA");
  if (v && (std::strcmp(v, "avx2") == 0 || std::strcmp(v, "compiled") == 0)) return vector_isa::compiled;
  return vector_isa::avx512;
}

std::atomic<vector_isa>& cap() {
  static std::atomic<vector_isa> c{cap_from_environment()};
  return c;
}

}  // namespace

bool cpu_has_avx512() {
#ifdef COROLLA_HAVE_AVX512_KERNELS
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

vector_isa decode_isa() {
  return cpu_has_avx512() && cap().load(std::memory_order_relaxed) == vector_isa::avx512 ? vector_isa::avx512
                                                                                           : vector_isa::compiled;
}

vector_isa limit_vector_isa(vector_isa c) { return cap().exchange(c); }

const char* isa_name(vector_isa isa) {
  if (isa == vector_isa::avx512) return "avx512";
#if defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace corolla::cpu
