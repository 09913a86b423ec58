// kernels/cpu/cpu_isa.hpp — which vector instructions the one-row decode
// kernels of 16-bit and quantised weights (bf16, int8, nf4) run with.
//
// The build compiles for the build machine without AVX-512 (GCC 12
// miscompiles some 512-bit constants; top-level CMakeLists.txt). The bf16,
// int8 and nf4 dot products are bound by the instructions that widen and
// look up weights as much as by memory, and AVX-512 cuts those to a half or
// a third (one vpermps looks up all 16 NF4 codes; AVX2 needs two and a
// blend), so those kernels carry an AVX-512 version compiled for that
// function alone and chosen here at run time: when the CPU has AVX-512
// F/BW/VL/DQ, unless COROLLA_CPU_ISA=avx2 (read once) or a caller's limit
// says otherwise.
#pragma once

namespace corolla::cpu {

enum class vector_isa {
  compiled,  ///< what the build's flags give (AVX2 and FMA with -march=native on x86-64)
  avx512,    ///< AVX-512 F/BW/VL/DQ, in the kernels that have a version for it
};

/// The instructions the bf16, int8 and nf4 decode kernels use now.
vector_isa decode_isa();

/// Whether this CPU (and compiler) can run the AVX-512 kernels at all.
bool cpu_has_avx512();

/// Caps decode_isa() at `cap` (tests run every path; benchmarks compare
/// them) and returns the previous cap. Not for use while kernels run.
vector_isa limit_vector_isa(vector_isa cap);

/// "avx512", or for `compiled` "avx2" (or "scalar" when the build has no
/// AVX2).
const char* isa_name(vector_isa isa);

}  // namespace corolla::cpu

/// The GCC/Clang attribute that compiles one function for AVX-512. GCC 12
/// warns that its own AVX-512 intrinsics (their _mm512_undefined_*
/// placeholders) read uninitialised values in such functions; the
/// COROLLA_AVX512_BEGIN/END pair around them silences that.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define COROLLA_HAVE_AVX512_KERNELS 1
#define COROLLA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define COROLLA_AVX512_BEGIN                                   \
  _Pragma("GCC diagnostic push")                               \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")        \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define COROLLA_AVX512_END _Pragma("GCC diagnostic pop")
#endif
