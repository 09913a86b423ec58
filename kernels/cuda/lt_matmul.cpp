// kernels/cuda/lt_matmul.cpp — one cuBLASLt product
// (cuda_backend::lt_matmul): its descriptors, the algorithm it runs, the
// launch. gemm.cpp, gemm_epilogues.cpp and gemm_same_x.cpp call it.
//
// Row-major <-> column-major: cuBLAS sees a row-major [r, c] buffer as the
// column-major c x r matrix (its transpose). So row-major C = op(A) op(B) is
// computed as column-major C^T = op(B)^T op(A)^T: cuBLAS's "A" is our b
// (op = trans_b), its "B" our a (op = trans_a), its m x n our n x m. Each
// layout describes the stored buffer: rows = the buffer's row length,
// cols = its row count, ld = its row stride.
//
// Precision: CUBLAS_COMPUTE_32F with f32 scale for every dtype (no TF32, so
// f32 products match the CPU reference at f32 tolerance); bf16/f16 inputs
// accumulate in f32. The output may be f32 or the inputs' 16-bit dtype.
// set_matmul_precision(tf32 | bf16) lets f32 products run on the tensor
// cores (CUBLAS_COMPUTE_32F_FAST_TF32 / _FAST_16BF: operands rounded, f32
// accumulation), for training speed at that precision.
//
// The algorithm (docs/cuda.md, "cuBLASLt's algorithms"): the descriptors
// are rebuilt per call (microseconds), the algorithm is chosen once per
// problem (lt_key: shapes, strides, dtypes, epilogue, pointer alignments).
// A 16-bit output takes no split-K algorithm that reduces its partial sums
// in (or in place of) the output's dtype, timed or not (one rounding;
// without such an algorithm, the heuristic's first of all). On a problem's
// first call the heuristic names up to gemm_tune_candidates algorithms;
// each is timed on this call's own operands and gemm_choose_timed picks
// one (gemm_tuner.hpp). Timing writes only what the call itself writes
// next (d, a GELU_AUX matrix), except where the call also reads d (d is c
// and beta is not 0, or d is DGELU's aux): then d's timing copy is
// scratch, so the accumulation the caller asked for happens once. No
// timing (the heuristic's first, kept): COROLLA_CUDA_GEMM_TUNE=0,
// COROLLA_CUDA_SYNC (every launch a host round trip), a stream being
// captured into a graph, lt_extra::tune false, below gemm_tune_min_flops,
// past gemm_tune_max_problems, a problem with one candidate, a scratch
// above gemm_tune_max_scratch_bytes or no memory for it. With
// COROLLA_CUDA_GEMM_TUNE_FILE a problem recorded there runs the recorded
// algorithm untimed where the heuristic names it again (or, if its launch
// refuses it, the heuristic's first), and one timed now (the recorded
// algorithm no longer among the candidates too) is appended
// (gemm_tuning_file.hpp).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "kernels/cuda/allocator.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/gemm_tuner.hpp"
#include "kernels/cuda/gemm_tuning_file.hpp"

namespace corolla::cuda {
namespace {

cudaDataType_t cuda_type(dtype t) {
  switch (t) {
    case dtype::f32: return CUDA_R_32F;
    case dtype::bf16: return CUDA_R_16BF;
    case dtype::f16: return CUDA_R_16F;
    default: throw tensor_error(std::string("gemm: no cuBLAS type for ") + dtype_name(t));
  }
}

// RAII owners of the cuBLASLt descriptors (destroy statuses are ignored:
// nothing useful can be done with them in a destructor).
struct matmul_desc {
  cublasLtMatmulDesc_t d = nullptr;
  ~matmul_desc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct layout_desc {
  cublasLtMatrixLayout_t d = nullptr;
  ~layout_desc() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};
struct preference_desc {
  cublasLtMatmulPreference_t d = nullptr;
  ~preference_desc() {
    if (d) cublasLtMatmulPreferenceDestroy(d);
  }
};

cublasLtEpilogue_t lt_epilogue_of(lt_epilogue e) {
  using E = lt_epilogue;
  switch (e) {
    case E::bias: return CUBLASLT_EPILOGUE_BIAS;
    case E::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case E::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case E::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case E::none: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* lt_epilogue_name(lt_epilogue e) {
  using E = lt_epilogue;
  switch (e) {
    case E::bias: return ", bias epilogue";
    case E::gelu_aux: return ", GELU_AUX epilogue";
    case E::gelu_aux_bias: return ", GELU_AUX_BIAS epilogue";
    case E::dgelu: return ", DGELU epilogue";
    case E::none: break;
  }
  return "";
}

/// One cublasLtMatmul call but its algorithm: d = epilogue(alpha * B A + beta * c)
/// in cuBLAS's terms (see the file comment).
struct lt_call {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  const float* alpha = nullptr;
  const void* a = nullptr;  ///< cuBLAS's A (our b)
  const void* b = nullptr;  ///< cuBLAS's B (our a)
  const float* beta = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t s = nullptr;
  cublasStatus_t operator()(const cublasLtMatmulAlgo_t& algo) const {
    return cublasLtMatmul(lt, op, alpha, a, la, b, lb, beta, c, lc, d, lc, &algo, workspace, workspace_bytes, s);
  }
};

/// Events for timing, destroyed on every path out.
struct timing_events {
  std::vector<cudaEvent_t> events;
  explicit timing_events(std::size_t count) : events(count, nullptr) {
    try {
      for (cudaEvent_t& e : events) COROLLA_CUDA_CHECK(cudaEventCreate(&e));
    } catch (...) {  // no destructor runs for a constructor that throws
      release();
      throw;
    }
  }
  ~timing_events() { release(); }
  void release() {
    for (cudaEvent_t& e : events)
      if (e) cudaEventDestroy(std::exchange(e, nullptr));
  }
  timing_events(const timing_events&) = delete;
  timing_events& operator=(const timing_events&) = delete;
};

/// A launch that refused before running (argument checks: this algorithm
/// does not take these operands): a candidate skipped, not an error.
bool refused(cublasStatus_t s) {
  return s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE || s == CUBLAS_STATUS_ARCH_MISMATCH;
}

/// Microseconds of one launch of each of `algos` on `call` (NaN where its
/// launch refused): one warm-up launch each, then gemm_tune_rounds rounds
/// in which the algorithms take turns, each timed over `repeats` launches
/// back to back (so the GPU runs them without waiting on the host) and
/// keeping its fastest round. Any other failure throws. Waits for the
/// stream.
std::vector<double> time_algos(const lt_call& call, std::span<const cublasLtMatmulHeuristicResult_t> algos,
                               int repeats) {
  const std::size_t n = algos.size();
  const auto launch = [&](std::size_t i) {
    const cublasStatus_t status = call(algos[i].algo);
    if (status != CUBLAS_STATUS_SUCCESS && !refused(status))
      throw_cublas_error(status, "cublasLtMatmul (timing a candidate)", __FILE__, __LINE__);
    return status == CUBLAS_STATUS_SUCCESS;
  };
  std::vector<bool> runs(n);
  for (std::size_t i = 0; i < n; ++i) runs[i] = launch(i);
  timing_events ev(2 * n * gemm_tune_rounds);
  const auto start = [&](std::size_t at) { return ev.events[2 * at]; };
  const auto stop = [&](std::size_t at) { return ev.events[2 * at + 1]; };
  for (int round = 0; round < gemm_tune_rounds; ++round)
    for (std::size_t i = 0; i < n; ++i) {
      if (!runs[i]) continue;
      const std::size_t at = static_cast<std::size_t>(round) * n + i;
      COROLLA_CUDA_CHECK(cudaEventRecord(start(at), call.s));
      for (int r = 0; r < repeats && runs[i]; ++r) runs[i] = launch(i);  // refused now: not counted
      COROLLA_CUDA_CHECK(cudaEventRecord(stop(at), call.s));
    }
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(call.s));
  COROLLA_CUDA_LAUNCH_CHECK("cublasLtMatmul (timing)");
  std::vector<double> us(n, std::numeric_limits<double>::quiet_NaN());
  for (std::size_t i = 0; i < n; ++i) {
    if (!runs[i]) continue;
    for (int round = 0; round < gemm_tune_rounds; ++round) {
      const std::size_t at = static_cast<std::size_t>(round) * n + i;
      float ms = 0;
      COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start(at), stop(at)));
      const double each = 1000.0 * ms / repeats;
      us[i] = std::isnan(us[i]) ? each : std::min(us[i], each);
    }
  }
  return us;
}

/// "bf16 x bf16 -> f32, a^T, bias epilogue" for a gemm_choice.
std::string problem_text(dtype at, dtype bt, dtype ct, bool trans_a, bool trans_b, lt_epilogue e) {
  std::string s = std::string(dtype_name(at)) + " x " + dtype_name(bt) + " -> " + dtype_name(ct);
  if (trans_a) s += ", a^T";
  if (trans_b) s += ", b^T";
  return s + lt_epilogue_name(e);
}

/// A problem's key as text for the results file: lt_key's numbers (its
/// dims, align and flags), comma separated.
std::string problem_key(const auto& dims, const auto& align, const auto& flags) {
  std::string s;
  const auto put = [&s](auto v) {
    if (!s.empty()) s += ',';
    s += std::to_string(v);
  };
  for (const std::int64_t v : dims) put(v);
  for (const std::uint32_t v : align) put(v);
  for (const std::uint8_t v : flags) put(static_cast<int>(v));
  return s;
}

/// Whether work queued on `s` now is being captured into a graph.
bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

bool cuda_backend::lt_matmul(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                             const void* a, dtype at, std::int64_t lda, const void* b, dtype bt, std::int64_t ldb,
                             float beta, void* c, dtype ct, std::int64_t ldc, const lt_extra& extra) {
  ensure_lt_workspace();
  matmul_desc op;
  // f32 operands may use the tensor cores at a lower input precision.
  const matmul_precision precision =
      at == dtype::f32 && bt == dtype::f32 ? get_matmul_precision() : matmul_precision::f32;
  const cublasComputeType_t compute = precision == matmul_precision::tf32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : precision == matmul_precision::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                                            : CUBLAS_COMPUTE_32F;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.d, compute, CUDA_R_32F));
  // cuBLAS "A" = our b, "B" = our a (see the file comment).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                      sizeof op_a));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                      sizeof op_b));
  if (extra.epilogue != lt_epilogue::none) {
    const cublasLtEpilogue_t epilogue = lt_epilogue_of(extra.epilogue);
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof epilogue));
  }
  if (extra.epilogue == lt_epilogue::bias || extra.epilogue == lt_epilogue::gelu_aux_bias) {
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &extra.bias, sizeof extra.bias));
    const cudaDataType_t bias_type = cuda_type(ct);  // callers pass a bias of c's dtype
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        op.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  const bool has_aux = extra.epilogue == lt_epilogue::gelu_aux || extra.epilogue == lt_epilogue::gelu_aux_bias ||
                       extra.epilogue == lt_epilogue::dgelu;
  if (has_aux) {  // the aux matrix is laid out as d (cuBLAS's n x m, column-major), of d's dtype
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                        &extra.aux, sizeof extra.aux));
    const std::int64_t aux_ld = extra.aux_ld;
    COROLLA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  // Stored buffers: b is [k, n] (or [n, k] when transposed), a is [m, k]
  // (or [k, m]), c (and d) is [m, n]; each as column-major (row length,
  // row count).
  layout_desc la, lb, lc;
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.d, cuda_type(bt), trans_b ? k : n,
                                                  trans_b ? n : k, ldb));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.d, cuda_type(at), trans_a ? m : k,
                                                  trans_a ? k : m, lda));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc.d, cuda_type(ct), n, m, ldc));
  void* const d = extra.d ? extra.d : c;
  if (extra.batch > 1) {
    if (has_aux) throw std::logic_error("lt_matmul: a strided batch with an aux matrix");
    const std::int32_t count = extra.batch;
    const auto set_batch = [&](layout_desc& l, std::int64_t stride) {
      COROLLA_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                            &stride, sizeof stride));
    };
    set_batch(la, extra.batch_b);
    set_batch(lb, extra.batch_a);
    set_batch(lc, extra.batch_c);
    if (extra.bias) {
      // cuBLASLt has no alignment preference for the bias and sees only the
      // first: every later one must be as aligned, up to 16 bytes (a vector
      // load). GPT-2-1.5B's q/k/v bias stride is 128-byte aligned.
      const auto* later = static_cast<const char*>(extra.bias) + extra.batch_bias * static_cast<std::int64_t>(dtype_size(ct));
      if (std::min(alignment_of(later), 16u) < std::min(alignment_of(extra.bias), 16u)) {
        if (extra.may_decline) return false;
        throw std::invalid_argument("lt_matmul: a batch's bias stride misaligns its later biases");
      }
      COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                          &extra.batch_bias, sizeof extra.batch_bias));
    }
  }

  // The heuristic assumes 256-byte aligned pointers unless told otherwise;
  // views (slices) can start anywhere a dtype allows; so can a batch's
  // later products (the alignment of base + stride bounds them all).
  const auto batch_alignment = [&](const void* p, std::int64_t stride, dtype t) {
    const std::uint32_t first = alignment_of(p);
    if (extra.batch <= 1 || stride == 0) return first;
    const auto bytes = stride * static_cast<std::int64_t>(dtype_size(t));
    return std::min(first, alignment_of(static_cast<const char*>(p) + bytes));
  };
  const std::uint32_t align_a = batch_alignment(b, extra.batch_b, bt), align_b = batch_alignment(a, extra.batch_a, at);
  const std::uint32_t align_c = batch_alignment(c, extra.batch_c, ct), align_d = batch_alignment(d, extra.batch_c, ct);
  const std::uint32_t align_aux = has_aux ? alignment_of(extra.aux) : 256;
  lt_key key;
  key.dims = {m,           n,  k, lda, ldb, ldc, has_aux ? extra.aux_ld : 0,
              extra.batch, extra.batch_a, extra.batch_b, extra.batch_c, extra.batch_bias};
  key.align = {align_a, align_b, align_c, align_d, align_aux};
  key.flags = {static_cast<std::uint8_t>(trans_a), static_cast<std::uint8_t>(trans_b),
               static_cast<std::uint8_t>(at),      static_cast<std::uint8_t>(bt),
               static_cast<std::uint8_t>(ct),      static_cast<std::uint8_t>(extra.epilogue),
               static_cast<std::uint8_t>(precision), static_cast<std::uint8_t>(d != c),
               static_cast<std::uint8_t>(extra.may_decline)};
  if (extra.may_decline && lt_declined_.count(key)) return false;
  lt_call call{lt_,   op.d,  la.d, lb.d, lc.d, &alpha, b, a, &beta, c, d, lt_workspace_, lt_workspace_bytes_,
               stream_};
  auto it = lt_algos_.find(key);
  if (it == lt_algos_.end()) {
    // Timed where worth it and possible (the file comment), else the
    // heuristic's first.
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                         std::max(1, extra.batch);
    bool tune = extra.tune && gemm_tuning_requested() && flops >= gemm_tune_min_flops &&
                static_cast<int>(lt_choices_.size()) < gemm_tune_max_problems && !sync_after_launch() &&
                !capturing(stream_);
    // With a 16-bit output, one rounding (the fused forms promise it before
    // the epilogue adds the residual or takes the GELU): no split-K
    // algorithm that reduces its partial sums in (or in place of) the
    // output's dtype.
    const auto ask = [&](bool one_rounding, int count, cublasLtMatmulHeuristicResult_t* results, int& found) {
      preference_desc pref;
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.d));
      const std::uint64_t workspace = lt_workspace_bytes_;
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d));
      if (one_rounding) {
        const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref.d, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
      }
      found = 0;
      return cublasLtMatmulAlgoGetHeuristic(lt_, op.d, la.d, lb.d, lc.d, lc.d, pref.d, count, results, &found);
    };
    std::array<cublasLtMatmulHeuristicResult_t, gemm_tune_candidates> results{};
    int found = 0;
    const bool sixteen = ct != dtype::f32;
    cublasStatus_t status = ask(sixteen, tune ? gemm_tune_candidates : 1, results.data(), found);
    if (!extra.may_decline && sixteen && (status != CUBLAS_STATUS_SUCCESS || found == 0)) {
      tune = false;  // none with one rounding: the heuristic's first of all, untimed
      status = ask(false, 1, results.data(), found);
    }
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED &&
        !(extra.may_decline && status == CUBLAS_STATUS_INVALID_VALUE))
      throw_cublas_error(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      if (extra.may_decline) {
        lt_declined_.insert(key);
        return false;
      }
      throw std::runtime_error(
          "gemm on " + name() + ": cuBLASLt has no algorithm for m=" + std::to_string(m) +
          " n=" + std::to_string(n) + " k=" + std::to_string(k) + " (" + dtype_name(at) + " x " +
          dtype_name(bt) + " -> " + dtype_name(ct) + lt_epilogue_name(extra.epilogue) +
          ", trans_a=" + std::to_string(trans_a) + " trans_b=" + std::to_string(trans_b) +
          ", alignments " + std::to_string(align_b) + "/" + std::to_string(align_a) + "/" +
          std::to_string(align_c) + " bytes)");
    }
    lt_algo stored;
    int pick = 0;
    gemm_tuning_file* const file = tune && found > 1 ? tuning_file() : nullptr;
    const std::string problem = file ? problem_key(key.dims, key.align, key.flags) : std::string();
    const std::optional<gemm_tuning_entry> known = file ? file->find(problem) : std::nullopt;
    const auto record = [&](int chosen, double first_us, double chosen_us, bool from_file) {
      gemm_choice choice;
      choice.m = m;
      choice.n = n;
      choice.k = k;
      choice.batch = extra.batch;
      choice.what = problem_text(at, bt, ct, trans_a, trans_b, extra.epilogue);
      choice.candidates = found;
      choice.chosen = chosen;
      choice.first_us = first_us;
      choice.chosen_us = chosen_us;
      choice.from_file = from_file;
      stored.choice = static_cast<int>(lt_choices_.size());
      lt_choices_.push_back(std::move(choice));
    };
    // The recorded algorithm, where the heuristic names it again (at any
    // position): run untimed.
    const auto named = [&]() -> std::optional<int> {
      if (!known) return std::nullopt;
      std::vector<std::array<std::uint64_t, 8>> candidates(static_cast<std::size_t>(found));
      for (int i = 0; i < found; ++i)
        std::memcpy(candidates[static_cast<std::size_t>(i)].data(), &results[static_cast<std::size_t>(i)].algo,
                    sizeof candidates[0]);
      return find_gemm_algorithm(candidates, known->algo);
    }();
    if (named) {
      pick = *named;
      record(pick, known->first_us, known->chosen_us, true);
      if (pick != 0) {  // never run in this process: the heuristic's first stands by (below)
        stored.first.emplace();
        std::memcpy(stored.first->data(), &results[0].algo, sizeof(cublasLtMatmulAlgo_t));
      }
    } else if (tune && found > 1) {
      // Where d is c and beta is not 0 (or d is the aux matrix DGELU
      // reads) the timed launches write a scratch copy of d, as aligned as
      // d (the algorithms were asked for d's alignment), so the caller's
      // accumulation happens once and what is read stays as it was.
      Tensor timing_d;
      lt_call timed = call;
      const bool d_is_read = (beta != 0.0f && d == c) || (extra.epilogue == lt_epilogue::dgelu && d == extra.aux);
      if (d_is_read) {
        const auto bytes = static_cast<std::int64_t>(dtype_size(ct)) *
                           lt_output_span(m, n, ldc, extra.batch, extra.batch_c);
        if (bytes <= gemm_tune_max_scratch_bytes) {
          try {
            timing_d = empty({bytes + 512}, dtype::i8);
          } catch (const cuda_out_of_memory&) {  // no timing rather than no product
          }
        }
        timed.d = nullptr;
        if (timing_d.defined()) {
          const auto base = (reinterpret_cast<std::uintptr_t>(timing_d.raw()) + 255) & ~std::uintptr_t{255};
          timed.d = reinterpret_cast<void*>(base + (align_d < 256 ? align_d : 0));  // exactly d's alignment
        }
      }
      if (!d_is_read || timed.d != nullptr) {
        std::vector<double> us;
        try {
          us = time_algos(timed, {results.data(), static_cast<std::size_t>(found)}, gemm_tune_repeats(flops));
        } catch (...) {
          cudaStreamSynchronize(stream_);  // nothing queued may still write timing_d once it is freed
          throw;
        }
        pick = gemm_choose_timed(us);
        const double chosen_us = us[static_cast<std::size_t>(pick)];
        if (std::isfinite(chosen_us)) {  // else none ran: nothing to record
          record(pick, us[0], chosen_us, false);
          if (file) {
            try {  // the file is a cache: the product runs whether or not it can be written
              gemm_tuning_entry e{pick, found, us[0], chosen_us, {}};
              std::memcpy(e.algo.data(), &results[static_cast<std::size_t>(pick)].algo, sizeof e.algo);
              file->add(problem, e);
            } catch (const std::exception& e) {
              spdlog::warn("{}; this process's choices are no longer written there", e.what());
              tuning_file_.reset();  // read_ stays true: no file from now on
            }
          }
        }
      }
    }
    static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof stored.algo, "cublasLtMatmulAlgo_t size");
    std::memcpy(stored.algo.data(), &results[static_cast<std::size_t>(pick)].algo, sizeof stored.algo);
    it = lt_algos_.emplace(key, stored).first;
  }
  cublasLtMatmulAlgo_t algo{};
  std::memcpy(&algo, it->second.algo.data(), sizeof algo);
  const int choice = it->second.choice;
  cublasStatus_t launched = call(algo);
  if (refused(launched) && it->second.first) {
    // A pick from the tuning file this cuBLASLt refuses (a file written
    // where the heuristic answered alike but its algorithms differ): the
    // heuristic's first runs instead, from now on, and the record says so.
    spdlog::warn("gemm on {}: cuBLASLt refused the algorithm COROLLA_CUDA_GEMM_TUNE_FILE names for m={} n={} k={}; "
                 "running the heuristic's first",
                 name(), m, n, k);
    it->second.algo = *it->second.first;
    it->second.first.reset();
    std::memcpy(&algo, it->second.algo.data(), sizeof algo);
    if (choice >= 0) {  // the heuristic's first, never timed here: out of the totals
      gemm_choice& c = lt_choices_[static_cast<std::size_t>(choice)];
      c.chosen = 0;
      c.first_us = c.chosen_us = std::numeric_limits<double>::quiet_NaN();
      c.from_file = false;
    }
    launched = call(algo);
  }
  if (extra.may_decline && refused(launched)) {
    // Refused before anything ran (argument checks): the caller's fallback
    // runs, and the problem's record (made just now, never called) goes.
    if (choice >= 0 && static_cast<std::size_t>(choice) + 1 == lt_choices_.size() && lt_choices_.back().calls == 0)
      lt_choices_.pop_back();
    lt_algos_.erase(it);
    lt_declined_.insert(key);
    return false;
  }
  if (choice >= 0 && launched == CUBLAS_STATUS_SUCCESS) ++lt_choices_[static_cast<std::size_t>(choice)].calls;
  if (launched != CUBLAS_STATUS_SUCCESS) throw_cublas_error(launched, "cublasLtMatmul", __FILE__, __LINE__);
  COROLLA_CUDA_LAUNCH_CHECK("cublasLtMatmul");  // with COROLLA_CUDA_SYNC=1: faults located here
  return true;
}

std::vector<gemm_choice> cuda_backend::gemm_choices() const { return lt_choices_; }

gemm_tuning_file* cuda_backend::tuning_file() {
  if (!tuning_file_read_) {
    tuning_file_read_ = true;
    if (const std::string path = gemm_tuning_file_path(); !path.empty()) {
      // The platform: what the heuristic's answer depends on besides the
      // problem (a MIG slice has fewer SMs; the workspace bounds split-K).
      try {  // a cache: without it, problems are timed as without the variable
        int sms = 0;
        COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index_));
        const std::string platform = device_description(index_) + ", " + std::to_string(sms) + " SMs; cuBLASLt " +
                                     std::to_string(cublasLtGetVersion()) + ", workspace " +
                                     std::to_string(lt_workspace_bytes_);
        tuning_file_ = std::make_unique<gemm_tuning_file>(path, platform);
      } catch (const std::exception& e) {
        spdlog::warn("{}; COROLLA_CUDA_GEMM_TUNE_FILE is not used by this process", e.what());
      }
    }
  }
  return tuning_file_.get();
}

}  // namespace corolla::cuda
