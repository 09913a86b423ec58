// kernels/cuda/linear_bf16.hpp — linear with an f32 input and a bf16
// (inference) weight, launcher only (host-only: no CUDA types).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/stream.hpp"
#include "kernels/rope_spec.hpp"

namespace corolla::cuda {

/// What the GEMV does with an output's sum v: the op it ends with, fused
/// (each the unfused op's expression, so the same bits).
enum class gemv_epilogue {
  bias,      ///< y = v + bias (bias may be null: 0)
  residual,  ///< y = residual + (v + bias): linear, then add
  gelu,      ///< y = gelu(v + bias): linear, then the tanh GELU
  swiglu,    ///< y = silu(v_gate) * v_up, rows o and out + o of a [2 out, in] w: linear, then swiglu
};

/// y[rows, out] = epilogue(x[rows, in] @ w^T) (gemv_epilogue), x, bias,
/// residual, y f32 and w bf16 ([out, in], for swiglu [2 out, in]), products
/// summed in f32 (see Backend::linear). residual may be y itself. One warp
/// per output feature takes up to 8 rows per pass over the weight row, so
/// batch-1 to batch-8 decode reads every weight once (16-byte loads when
/// in % 8 == 0 and x, w are 16-byte aligned); more rows make more passes
/// (correct, not tuned for prefill). rows, in, out > 0.
///
/// Calls on the 16-byte path have launch variants (rows per pass, loads in
/// flight per lane, warps per block, warps per output, outputs per warp;
/// gemv_variant_names) that give bit-identical results. The first batch-1
/// call for a (device, in, weight rows) times each (plain epilogue, into a
/// scratch buffer of its own, L2 flushed before every timed launch, the
/// variants taking turns) and keeps the fastest the tuner may choose
/// (gemv_variant_tuned) for every epilogue if it beats the default by 3 %;
/// the first call of 2-16 rows for a (device, in, weight rows, rows) does
/// the same among the variants of several rows per pass (a server's batch
/// of sessions: x's reads, not the weights', bound them). Not while the
/// stream is being captured, and not under COROLLA_CUDA_SYNC (the
/// default). COROLLA_GEMV=<variant> in the environment fixes one for one
/// row, and for more if it has several rows per pass (else the default),
/// instead (COROLLA_GEMV=auto is the
/// default; =all lets the tuner choose the untuned variants too, =nosplit
/// not the split ones). The kernel is launched as an early dependent
/// (device.hpp, set_early_launch) where the device has that.
void linear_bf16_weight(stream_t s, const float* x, std::int64_t rows, std::int64_t in, const void* w,
                        std::int64_t out, const float* bias, float* y, gemv_epilogue e = gemv_epilogue::bias,
                        const float* residual = nullptr);

/// Backend::linear_rope_store_kv on device pointers: x [1, in] f32, w bf16
/// [hq*head_dim + 2*hkv*head_dim, in] (q, k, v rows stacked), bias f32 of
/// as many outputs or null; q [hq*head_dim] f32 rotated by positions[0]
/// (device, i32) when `rotate`, the key (rotated likewise) and the value
/// into cache rows k_out and v_out of element type `cache`. One launch
/// (linear_bf16_rope_kv_kernel), the bits of linear_bf16_weight followed by
/// rope_store_kv. Needs in % 8 == 0 and 16-byte aligned x and w (the
/// caller checks); head_dim even.
void linear_bf16_rope_kv(stream_t s, const float* x, std::int64_t in, const void* w, const float* bias, float* q,
                         const std::int32_t* positions, int hq, int hkv, int head_dim, const rope_spec& spec,
                         bool rotate, elem cache, void* k_out, void* v_out);

/// The 16-byte GEMV's launch variants, "r<rows per pass>.u<loads in flight
/// per lane>.w<warps per block>" (the register kernel), "p<loads in
/// flight>.w<warps>" (the pipelined register kernel), "a<loads in
/// flight>.w<warps>" (the cp.async kernel), "s<warps to an
/// output>.u<loads in flight>.w<warps>" (the split kernel, an output's row
/// shared by two warps) and "r<rows>.o<outputs to a warp>.u<loads in
/// flight>.w<warps>" (several outputs to a warp, x read once for them);
/// the first is the default.
std::vector<std::string> gemv_variant_names();

/// Whether the tuner may choose variant `index` under this process's
/// COROLLA_GEMV (by default the cp.async variants are timed for the record
/// but never chosen, =all lets it choose them, =nosplit not the split
/// ones; COROLLA_GEMV=<name> can still fix any).
bool gemv_variant_tuned(int index);

/// Fixes the batch-1 variant for every later call in the process (an index
/// into gemv_variant_names(); out of range throws std::out_of_range), or
/// with -1 goes back to what COROLLA_GEMV says (by default, timing a
/// shape's first call). For tests and benchmarks that compare variants in
/// one process.
void set_gemv_variant(int index);

/// Throws std::invalid_argument, naming the variants, if COROLLA_GEMV names
/// none, or if COROLLA_CUDA_CARVEOUT is not a percentage
/// (launch_dependent.cuh); the CUDA backend calls it as it starts, so a
/// typo fails at once.
void check_gemv_setting();

/// What the first call for one weight shape and number of rows (1, or
/// 2-16) chose (linear_bf16_weight).
struct gemv_choice {
  int device = 0;
  std::int64_t in = 0, out = 0;      ///< out: weight rows (2 x outputs for swiglu)
  std::int64_t rows = 1;             ///< rows of x (1: batch-1 decode; more: chosen among several-row variants)
  int chosen = 0;                    ///< index into gemv_variant_names()
  /// Fastest launch of each variant, NaN for one not timed (the one-row
  /// variants for several rows); empty when not timed at all.
  std::vector<double> microseconds;
};

/// Every shape chosen for so far in this process, in the order first seen.
std::vector<gemv_choice> gemv_choices();

}  // namespace corolla::cuda
