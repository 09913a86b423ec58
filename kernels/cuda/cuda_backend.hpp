// kernels/cuda/cuda_backend.hpp — the CUDA implementation of Backend
// (host-only: no CUDA headers; C++20).
//
// One shared instance per device, created on first use by backend_for({cuda,
// N}) and never destroyed (the CUDA runtime may be torn down before static
// destructors run); companion() makes further ones for other threads, which
// their owners destroy. Each owns a stream (the shared instance's created
// blocking, so the memory hooks' legacy-default-stream copies order with
// it), a cuBLASLt handle with a 32 MiB workspace (a companion's on its
// first product), and grow-only scratch buffers (the decode hot path
// allocates nothing once warm).
//
// Where things live and what that costs:
//  * Float tensors of every op must be on this device. Index tensors (ids,
//    positions, targets) may be on the host or on this device; they are
//    validated on the host like the CPU backend does, so a device-resident
//    index tensor is first copied down (one small D2H copy and a stream
//    synchronisation), a host one is uploaded.
//  * kv_pages_view holds host arrays of page pointers and, from a
//    kv_sequence on this device, the same tables in device memory: then
//    attention_cached uploads nothing and attention_cached_batch only its
//    rows' table addresses and key counts, once for all layers of a step.
//    Without device tables each call uploads the pages it reads.
//  * Ops are asynchronous on the stream except where a host value is
//    returned or read (sum_squares, copies to the host, device index checks).
//
// Files: gemm.cpp (gemm, linear, linear_backward: cuBLASLt, each product
// an lt_matmul: lt_matmul.cpp), cuda_ops.cpp
// (every other op: checks, then a launcher from <family>.hpp whose kernels
// are in <family>.cu), this header's cuda_backend.cpp (registry, copies,
// scratch).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cuda/gemm_tuner.hpp"
#include "kernels/cuda/gemm_tuning_file.hpp"
#include "kernels/cuda/page_tables.hpp"
#include "kernels/cuda/stream.hpp"

struct cublasLtContext;

namespace corolla::cuda {

/// The storage type of float dtype `t` (what the launchers take); throws
/// tensor_error naming `what` for another dtype.
elem elem_of(dtype t, const char* what);

/// What a cuBLASLt product does after the multiply, in its epilogue
/// (gemm.cpp): nothing, add a bias along the output features, or GELU
/// (with the bias first) writing its input to an aux matrix, or multiply
/// by GELU's derivative at an aux matrix's values.
enum class lt_epilogue : std::uint8_t { none, bias, gelu_aux, gelu_aux_bias, dgelu };
/// lt_matmul's optional parts.
struct lt_extra {
  lt_epilogue epilogue = lt_epilogue::none;
  const void* bias = nullptr;  ///< bias, gelu_aux_bias: of c's dtype, one per output feature
  void* aux = nullptr;         ///< gelu_aux*: the GELU input, written; dgelu: read. c's dtype and layout
  std::int64_t aux_ld = 0;     ///< aux's row stride (a multiple of 8, at least n)
  void* d = nullptr;           ///< the output where it is not c (c is then only read, times beta)
  /// No algorithm for this product (or the launch refused): return false
  /// with nothing done, rather than throw. For fused forms that have an
  /// unfused fallback; with a 16-bit output they take only algorithms that
  /// reduce split-K partial sums in f32 (one rounding), which other
  /// products prefer but fall back from.
  bool may_decline = false;
  /// The algorithm may be timed among the heuristic's candidates on the
  /// problem's first call (gemm_tuner.hpp); false keeps the heuristic's
  /// first: linear's widened bf16 weights (inference prefill, whose row
  /// count changes with every prompt). Not part of lt_key: the first call
  /// of a problem decides.
  bool tune = true;
  /// A strided batch of `batch` products (no aux): product i's a at a + i *
  /// batch_a elements, b at b + i * batch_b, c (and d) at c + i * batch_c,
  /// the bias at bias + i * batch_bias; a stride of 0 shares the operand.
  int batch = 1;
  std::int64_t batch_a = 0, batch_b = 0, batch_c = 0, batch_bias = 0;
};

/// lt_matmul's extra for a bias epilogue (none without a bias).
inline lt_extra bias_epilogue(const void* bias) {
  lt_extra e;
  if (bias) {
    e.epilogue = lt_epilogue::bias;
    e.bias = bias;
  }
  return e;
}

/// Backend for CUDA device `index`. Thread-compatible (one caller at a time),
/// like every Backend.
class cuda_backend final : public Backend {
 public:
  /// Creates the stream and cuBLASLt handle on device `index`; throws
  /// std::runtime_error naming the failing call.
  explicit cuda_backend(int index);
  ~cuda_backend() override;
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  std::string name() const override { return dev().str(); }
  device dev() const override { return {device_kind::cuda, index_}; }
  Tensor empty(shape_t shape, dtype t = dtype::f32) override;
  /// cudaHostAlloc'd (pinned) host memory, freed with cudaFreeHost; ordinary
  /// host memory when the driver refuses.
  Tensor host_empty(shape_t shape, dtype t = dtype::f32) override;

  // Ops implement the contracts documented on Backend (kernels/backend.hpp).
  // gemm/linear/linear_backward take f32, bf16 or f16 (a and b of one dtype,
  // accumulation in f32, outputs any float dtype; linear also takes f32 x
  // with a bf16 weight, linear_bf16.cu); the elementwise ops
  // (swiglu, gelu, add, scale, sum_squares), embedding's forward, the norms,
  // rope, cross_entropy and training attention take f32, bf16 or f16
  // activations (docs/cuda.md lists which operands stay f32); the decode
  // ops against the KV cache, embedding_backward and adamw are f32 like the
  // CPU.
  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  /// The int8 GEMV of linear_q8.cu for up to gemv_rows rows (decode); more
  /// rows (prefill) dequantise the weight into a temporary f32 copy once and
  /// run linear().
  void linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias, Tensor& y) override;
  /// The NF4 GEMV of nf4.cu for up to gemv_rows rows, else as linear_q8.
  void linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias, Tensor& y) override;
  /// Rows up to which the quantised products run their GEMV.
  static constexpr std::int64_t gemv_rows = 16;
  /// The bf16-weight GEMV with its epilogue (linear_bf16.hpp) for f32 x of
  /// 1 to 16 rows and a bf16 w; add through cuBLASLt for the products
  /// check_linear_add_product takes (linear_add_lt); false for others.
  bool linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e, const Tensor* residual,
                    Tensor& y) override;
  /// Through cuBLASLt's GELU_AUX(_BIAS) epilogue (gemm_epilogues.cpp) for
  /// the operands check_linear_gelu takes; false for others.
  bool linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& pre, Tensor& y) override;
  /// Through cuBLASLt's DGELU epilogue (gemm_epilogues.cpp) for the
  /// operands check_gemm_gelu_backward takes; false for others.
  bool gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) override;
  /// The q/k/v GEMV with RoPE and the cache append as its epilogue
  /// (linear_bf16_rope_kv) for one f32 row, a bf16 stacked weight, in % 8
  /// == 0 and 16-byte aligned x and w; false for anything else.
  bool linear_rope_store_kv(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& positions, int hq,
                            int hkv, int head_dim, const rope_spec& spec, bool rotate, Tensor& q, void* k_out,
                            void* v_out, dtype cache_type) override;
  /// The problems this instance's cuBLASLt products timed their algorithms
  /// for (gemm_tuner.hpp), in the order first met, with their calls since.
  std::vector<gemm_choice> gemm_choices() const;
  /// linear_same_x and its backward calls run as one batched product on
  /// this instance (the rest ran the Backend default): for tests and benches.
  int batched_products() const { return batched_products_; }
  void linear_same_x(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> bs,
                     std::span<Tensor* const> ys) override;
  void linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> dys,
                              Tensor* dx, std::span<Tensor* const> dws, std::span<Tensor* const> dbs) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                       Tensor& dw, Tensor* db) override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) override;
  // Mixture-of-experts row moves (cuda_moe.cpp): f32, indices on the host
  // or the device, checked on the host.
  void moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) override;
  void moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                   Tensor& out) override;
  void moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots, Tensor& dweights) override;

  void add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps,
                   Tensor& y) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) override;
  void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                        Tensor& dx, Tensor& dw) override;
  /// The dx kernel adds dres before its one rounding (norm.cu).
  void rmsnorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dres,
                            Tensor& dx, Tensor& dw) override;
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                 Tensor* mean, Tensor* rstd) override;
  void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                          Tensor& db) override;
  /// The dx kernel adds dres before its one rounding (norm.cu).
  void layernorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dy, const Tensor& dres, Tensor& dx, Tensor& dw, Tensor& db) override;

  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv,
                     int head_dim, const rope_spec& spec, bool rotate, void* k_out, void* v_out,
                     dtype cache_type) override;
  void rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, const rope_spec& spec,
            bool inverse = false) override;

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq,
                 const attention_shape& s, Tensor& out, Tensor* lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, int batch, int seq,
                          const attention_shape& s, Tensor& dq, Tensor& dk,
                          Tensor& dv) override;
  void attention_cached(const Tensor& q, const kv_pages_view& cache, std::int64_t start_pos,
                        const attention_shape& s, Tensor& out) override;
  void rope_store_kv_pages(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv,
                           int head_dim, std::span<const kv_pages_view> caches, std::span<const std::int64_t> start_pos,
                           const rope_spec& spec, bool rotate) override;
  void attention_cached_batch(const Tensor& q, std::span<const kv_pages_view> caches,
                              std::span<const std::int64_t> start_pos, const attention_shape& s,
                              Tensor& out) override;

  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                       Tensor& dup) override;
  void gelu(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(Tensor& y, float alpha) override;
  double sum_squares(const Tensor& x) override;

  void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                     Tensor* dlogits, float grad_scale) override;

  void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
             std::int64_t step) override;
  /// One kernel: the update and the rounded copy (adamw_copy_kernel).
  void adamw_with_copy(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
                       std::int64_t step, Tensor& compute_copy) override;

  void quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) override;
  void dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) override;
  void quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) override;
  void dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) override;

  /// Host <-> this device and device <-> device (same device, or another
  /// CUDA device for equal dtypes), converting f32 <-> bf16/f16 on this
  /// device. Returns when a host destination holds the values.
  void copy(const Tensor& src, Tensor& dst) override;
  /// cudaStreamSynchronize; an asynchronous kernel fault surfaces here.
  void synchronize() override;
  /// An event recorded on the stream.
  std::shared_ptr<queue_marker> mark() override;
  /// On the transfer stream (created on first use, non-blocking): waits for
  /// `after`'s event, copies (cudaMemcpyAsync), then synchronises the
  /// transfer stream. Same dtype only (no staging scratch:
  /// it runs beside the ops of another thread), host <-> this device or
  /// within it.
  void copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) override;
  /// cudaEventSynchronize on `after`'s event.
  void wait(const queue_marker* after) override;
  /// A new instance on this device (a stream, cuBLASLt handle and scratch
  /// of its own), destroyed by its owner. Its stream is non-blocking (the
  /// memory hooks' legacy-stream work does not wait for it, nor it for
  /// them: its callers order it by host waits, as Backend::companion says).
  /// The caching allocator orders blocks by the shared instance's stream
  /// only, so a companion synchronises the device before it allocates
  /// (empty(), scratch growth): a block freed while another stream's queued
  /// work still uses it is never handed to it.
  std::unique_ptr<Backend> companion() override;
  void release_cached_memory() override;
  /// With step graphs on (device.hpp) on the shared instance, from a
  /// recording's second step (the first runs as it comes: the GEMV tuner,
  /// cuBLASLt's heuristics and scratch growth happen there, outside a
  /// capture): captures `ops` on the stream into a graph (relaxed mode;
  /// uploads staged in a capture arena of pinned memory that the graph
  /// reads when it runs), updates `rec`'s executable in place
  /// (cudaGraphExecUpdate; a new one where the topology changed) and
  /// launches it on the stream. The capture runs on a non-blocking stream
  /// of its own (a blocking one's capture makes the legacy default stream
  /// unusable for every thread meanwhile). A failed capture runs `ops`
  /// again without one; three in a row turn the recording off. Companions,
  /// COROLLA_CUDA_SYNC and graphs off run `ops` as it comes
  /// (kernels/cuda/step_graph.cpp).
  void run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) override;
  /// NCCL groups (nccl_comm.hpp) when built with NCCL: one device per
  /// member, so two members of a group need two GPUs.
  bool has_device_groups() const override;
  device_group_id new_group_id() override;
  std::unique_ptr<device_group> join_group(const device_group_id& id, int rank, int size,
                                           const group_give_up& give_up) override;

  /// The backend's stream (cudaStream_t), for NCCL and other libraries.
  stream_t stream() const { return stream_; }

 private:
  /// An i32 index vector readable on both sides.
  struct index_view {
    const std::int32_t* host = nullptr;
    const std::int32_t* dev = nullptr;
  };
  /// Checks `t` is an i32 [n] tensor on the host or this device and returns
  /// it on both sides (uploading into, or downloading through, `slot`).
  index_view indices(const Tensor& t, std::int64_t n, int slot, const char* what);
  /// rope's and rope_store_kv's positions: i32 [n], none negative (errors
  /// name `what`); their device copy.
  const std::int32_t* rope_positions(const Tensor& positions, std::int64_t n, const char* what);
  /// The scratch buffers; ops that use two at once take different ones.
  enum scratch_slot : int {
    slot_staging = 0,  ///< copy(): host data converted on the device
    slot_indices,      ///< index vectors uploaded for an op
    slot_pages,        ///< attention_cached's page-pointer table
    slot_batch_rows,   ///< attention_cached_batch's rows: table addresses, key counts
    slot_rows,         ///< rope_store_kv_pages' destination rows (without device tables)
    slot_reduce,       ///< partial sums and softmax states
    slot_widen,        ///< linear's bf16 weight widened to f32 (prefill)
    scratch_slots
  };
  /// At least `bytes` of device scratch in `slot` (grow-only; contents
  /// garbage). Slots used by one op at the same time must differ.
  void* scratch(int slot, std::size_t bytes);
  /// The column sums' partials for `sums` sums of `cols` columns over
  /// `rows` rows (column_sums.hpp): slot_reduce, or null for one chunk.
  float* column_partials(std::int64_t rows, std::int64_t cols, int sums);
  /// Copies `bytes` of host memory at `src` to device memory `dst` in stream
  /// order without waiting for the stream. Small copies (index vectors,
  /// page tables) go through a pinned staging ring: a copy from pageable
  /// memory may synchronise with the stream, which would drain the GPU's
  /// queue before every op that takes host indices. `src` may change as
  /// soon as this returns.
  void upload(void* dst, const void* src, std::size_t bytes);
  /// The norm backwards, with dres (the _add forms) or without (null).
  void rmsnorm_backward_into(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                             const Tensor* dres, Tensor& dx, Tensor& dw);
  void layernorm_backward_into(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                               const Tensor& dy, const Tensor* dres, Tensor& dx, Tensor& dw, Tensor& db);
  /// linear_fused's add for a many-row product: cuBLASLt with the residual
  /// as C, beta 1 (gemm_epilogues.cpp). False where it declines.
  bool linear_add_lt(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual, Tensor& y);
  /// The cuBLASLt product on device pointers (row-major, see gemm.cpp):
  /// d = epilogue(alpha * op(a) @ op(b) + beta * c), d = c unless
  /// extra.d. True when done; false only with extra.may_decline.
  bool lt_matmul(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const void* a, dtype at, std::int64_t lda, const void* b, dtype bt, std::int64_t ldb, float beta,
                 void* c, dtype ct, std::int64_t ldc, const lt_extra& extra = {});

  /// What a cuBLASLt algorithm choice depends on (the heuristic sees the
  /// descriptors and the preference, never alpha, beta or the data).
  struct lt_key {
    /// m, n, k, lda, ldb, ldc, aux_ld, batch and its strides (a, b, c, bias)
    std::array<std::int64_t, 12> dims{};
    std::array<std::uint32_t, 5> align{};  ///< cuBLAS's a, b, c, d and aux
    /// trans_a, trans_b, at, bt, ct, epilogue, precision, d != c, may_decline
    /// (a fused form: no 16-bit split-K reduction)
    std::array<std::uint8_t, 9> flags{};
    friend bool operator<(const lt_key& x, const lt_key& y) {
      return std::tie(x.dims, x.align, x.flags) < std::tie(y.dims, y.align, y.flags);
    }
  };
  /// The algorithm a problem runs (lt_matmul.cpp): chosen on its first
  /// call, since the heuristic query (let alone timing) costs far more
  /// than the product of a decode step.
  struct lt_algo {
    std::array<std::uint64_t, 8> algo{};  ///< a cublasLtMatmulAlgo_t
    int choice = -1;                      ///< its record in lt_choices_ where timed
    /// A pick read from the tuning file, not the heuristic's first: that
    /// first, run instead (and kept) if the launch refuses the pick.
    std::optional<std::array<std::uint64_t, 8>> first;
  };
  std::map<lt_key, lt_algo> lt_algos_;
  /// Problems the heuristic had none for, so a fused form with a fallback
  /// asks once.
  std::set<lt_key> lt_declined_;
  std::vector<gemm_choice> lt_choices_;  ///< see gemm_choices()
  /// COROLLA_CUDA_GEMM_TUNE_FILE's choices (gemm_tuning_file.hpp), read on
  /// the first problem timed; null without the variable.
  gemm_tuning_file* tuning_file();
  std::unique_ptr<gemm_tuning_file> tuning_file_;
  bool tuning_file_read_ = false;

  /// The shared instance, or with `companion` one for companion().
  cuda_backend(int index, bool companion);
  /// Before allocating, a companion waits for the device (see companion()).
  void before_allocating();
  /// The cuBLASLt workspace, allocated on first need (a companion's first
  /// product; the shared instance's at construction).
  void ensure_lt_workspace();

  int index_ = 0;
  bool companion_ = false;
  int batched_products_ = 0;  ///< see batched_products()
  stream_t stream_ = nullptr;
  cublasLtContext* lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  std::size_t lt_workspace_bytes_ = 0;
  Tensor scratch_[scratch_slots];
  std::vector<std::int32_t> host_indices_;
  struct staging_ring;  ///< pinned host memory for upload() (cuda_backend.cpp)
  staging_ring* ring_ = nullptr;  ///< created on first upload; lives with the backend
  struct capture_arena;  ///< pinned host memory for upload() while a step is captured (step_graph.cpp)
  capture_arena* arena_ = nullptr;  ///< created on the first capture; lives with the backend
  bool capturing_ = false;          ///< run_step is capturing (stream_ is capture_stream_ meanwhile)
  stream_t capture_stream_ = nullptr;  ///< run_step's captures (non-blocking; created on the first)
  /// The capture stream and arena made (first time), the arena rewound
  /// once the last graph that reads it has run. Throws when it cannot.
  void prepare_capture();
  /// A copy of `bytes` at `src` into the capture arena, for a captured
  /// upload: the graph reads it when it runs (step_graph.cpp).
  const void* stage_for_capture(const void* src, std::size_t bytes);
  /// Frees the capture arena and stream (the destructor's).
  void free_capture_arena();
  std::vector<const void*> host_pages_;
  std::vector<std::byte> host_batch_;  ///< attention_cached_batch's tables, staged for one upload
  /// upload() into scratch `slot` at `dst`, unless the last upload_once
  /// there put the same bytes at the same address (every layer of a decode
  /// step uploads the same positions and batch rows: once a step instead).
  /// Only slots whose every writer uses it may use it.
  void upload_once(int slot, void* dst, const void* src, std::size_t bytes);
  /// Forgets what upload_once knows: when a capture starts or ends (a
  /// captured upload runs only with its graph).
  void forget_uploads();
  struct slot_upload {
    const void* at = nullptr;  ///< null: nothing known
    std::vector<std::byte> bytes;
  };
  std::array<slot_upload, scratch_slots> uploaded_;
  /// Throws unless `page` (a cache page of `what`) is memory of this device.
  void require_device_page(const void* page, const char* what);
  /// Throws unless the device page tables of `cache` are memory of this device.
  void require_pages_device(const kv_pages_view& cache, const char* what);
  /// When every cache of a decode batch has its tables on this device alike
  /// (kv_sequences of one span): `t` describes the rows (their tables'
  /// addresses and key counts uploaded with upload_once: the same for every
  /// layer of a step, so once a step) and true. Else false, nothing done.
  bool device_page_rows(std::span<const kv_pages_view> caches, std::span<const std::int64_t> start_pos,
                        const char* what, batch_page_tables& t);
  std::mutex transfer_mu_;  ///< copy_after's callers, and the stream's creation
  stream_t transfer_ = nullptr;
};

/// The backend of device `index`, created on first use (thread-safe).
/// Throws std::runtime_error when no such device is visible.
cuda_backend& backend_for_device(int index);

}  // namespace corolla::cuda
