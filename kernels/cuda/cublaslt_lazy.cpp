// kernels/cuda/cublaslt_lazy.cpp — cuBLASLt, loaded when first used.
//
// libcublasLt is some 500 MB of code whose relocations alone cost every
// process that links it about 0.1 s and 25,000 page faults at start, GPU
// or not: the price of every `corolla` process (a rank re-planned after a
// failure, a swarm server, each test). The backend calls 17 of its
// functions; they are defined here with cublasLt.h's own signatures and
// forward to the library, which is dlopen()ed on the first call (by its
// soname, so LD_LIBRARY_PATH and the binary's run path apply, then at the
// path CMake found). Without it every call answers
// CUBLAS_STATUS_NOT_INITIALIZED and the first one logs why.
#include <dlfcn.h>

#include <string>

#include <cublasLt.h>
#include <spdlog/spdlog.h>

namespace {

#define COROLLA_STR2(x) #x
#define COROLLA_STR(x) COROLLA_STR2(x)

void* library() {
  static void* handle = [] {
    const std::string soname = "libcublasLt.so." COROLLA_STR(CUBLAS_VER_MAJOR);
    void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why = h ? "" : ::dlerror();
#ifdef COROLLA_CUBLASLT_PATH
    if (!h) {
      h = ::dlopen(COROLLA_CUBLASLT_PATH, RTLD_NOW | RTLD_LOCAL);
      if (!h) why += std::string("; ") + ::dlerror();
    }
#endif
    if (!h) spdlog::error("cannot load cuBLASLt ({}): {}", soname, why);
    return h;
  }();
  return handle;
}

/// The library's `name`, or null (logged once per name).
template <class F>
F* symbol(const char* name) {
  void* h = library();
  void* f = h ? ::dlsym(h, name) : nullptr;
  if (h && !f) spdlog::error("cuBLASLt has no {}", name);
  return reinterpret_cast<F*>(f);
}

}  // namespace

// Each function looks its target up once (a thread-safe static).
#define COROLLA_LT_FORWARD(name, params, args)                                \
  extern "C" cublasStatus_t name params {                                     \
    static auto* const f = symbol<decltype(::name)>(#name);                   \
    return f ? f args : CUBLAS_STATUS_NOT_INITIALIZED;                        \
  }

COROLLA_LT_FORWARD(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
COROLLA_LT_FORWARD(cublasLtDestroy, (cublasLtHandle_t handle), (handle))
COROLLA_LT_FORWARD(cublasLtMatmulDescCreate,
                   (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
                   (desc, compute, scale))
COROLLA_LT_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
COROLLA_LT_FORWARD(cublasLtMatmulDescSetAttribute,
                   (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size),
                   (desc, attr, buf, size))
COROLLA_LT_FORWARD(cublasLtMatrixLayoutCreate,
                   (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                   (layout, type, rows, cols, ld))
COROLLA_LT_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
COROLLA_LT_FORWARD(cublasLtMatrixLayoutSetAttribute,
                   (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t size),
                   (layout, attr, buf, size))
COROLLA_LT_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
COROLLA_LT_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
COROLLA_LT_FORWARD(cublasLtMatmulPreferenceSetAttribute,
                   (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                    size_t size),
                   (pref, attr, buf, size))
COROLLA_LT_FORWARD(cublasLtMatmulAlgoGetHeuristic,
                   (cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
                    int* returned),
                   (handle, op, a, b, c, d, pref, requested, results, returned))
COROLLA_LT_FORWARD(cublasLtMatmul,
                   (cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha, const void* a,
                    cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                    const void* c, cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                    const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream),
                   (handle, op, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo, workspace,
                    workspace_bytes, stream))
COROLLA_LT_FORWARD(cublasLtMatmulAlgoConfigGetAttribute,
                   (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                    size_t size, size_t* written),
                   (algo, attr, buf, size, written))

// The two status texts answer without the library too (an error message
// must not need what failed to load).
extern "C" const char* cublasLtGetStatusName(cublasStatus_t status) {
  static auto* const f = symbol<decltype(::cublasLtGetStatusName)>("cublasLtGetStatusName");
  return f ? f(status) : "CUBLAS_STATUS_NOT_INITIALIZED";
}

extern "C" const char* cublasLtGetStatusString(cublasStatus_t status) {
  static auto* const f = symbol<decltype(::cublasLtGetStatusString)>("cublasLtGetStatusString");
  return f ? f(status) : "cuBLASLt could not be loaded";
}

// A version, not a status: 0 without the library.
extern "C" size_t cublasLtGetVersion(void) {
  static auto* const f = symbol<decltype(::cublasLtGetVersion)>("cublasLtGetVersion");
  return f ? f() : 0;
}
