// kernels/cuda/cuda_backend.cpp — the CUDA backend's registry, stream and
// handles, tensor creation, copies (with conversion on the device), index
// tensors and scratch.
#include "kernels/cuda/cuda_backend.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <string>

#include "kernels/cuda/allocator.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/column_sums.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/linear_bf16.hpp"
#ifdef COROLLA_HAVE_NCCL
#include "kernels/cuda/nccl_comm.hpp"
#endif
#include "kernels/op_checks.hpp"

namespace corolla::cuda {
namespace {

constexpr std::size_t lt_workspace_size = std::size_t{32} << 20;

elem elem_for(dtype t) {
  switch (t) {
    case dtype::bf16: return elem::bf16;
    case dtype::f16: return elem::f16;
    default: return elem::f32;
  }
}

}  // namespace

/// Two halves of pinned host memory used in turn. Leaving a half records an
/// event on the stream; a half is written again only after the event of its
/// last use completed, i.e. after the copies out of it ran. With 512 KiB
/// halves and index vectors of a few hundred bytes, that wait comes once in
/// thousands of uploads and is normally already over.
struct cuda_backend::staging_ring {
  static constexpr std::size_t half = std::size_t{512} << 10;
  unsigned char* base = nullptr;  ///< 2 * half bytes, cudaHostAlloc; null: pinning failed
  cudaEvent_t left[2] = {nullptr, nullptr};
  bool pending[2] = {false, false};
  int current = 0;
  std::size_t offset = 0;
};

cuda_backend::cuda_backend(int index) : cuda_backend(index, false) {}

cuda_backend::cuda_backend(int index, bool companion) : index_(index), companion_(companion) {
  check_gemv_setting();  // a COROLLA_GEMV typo fails here, not at the first decode step
  install_memory_ops();
  device_guard guard(index);
  cudaStream_t s = nullptr;
  // The shared instance's stream is blocking on purpose: the tensor layer's
  // memory hooks use the legacy default stream, which then orders with it.
  // A companion's is not (see companion()).
  COROLLA_CUDA_CHECK(companion ? cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) : cudaStreamCreate(&s));
  stream_ = s;
  cublasLtHandle_t lt = nullptr;
  const cublasStatus_t st = cublasLtCreate(&lt);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(s);
    throw_cublas_error(st, "cublasLtCreate(&lt)", __FILE__, __LINE__);
  }
  lt_ = lt;
  // A companion takes its workspace on its first product (its usual ops,
  // copies and AdamW, need none).
  if (!companion) ensure_lt_workspace();
}

void cuda_backend::ensure_lt_workspace() {
  if (lt_workspace_ != nullptr) return;
  before_allocating();
  lt_workspace_ = device_allocate(lt_workspace_size, index_);
  lt_workspace_bytes_ = lt_workspace_size;
}

cuda_backend::~cuda_backend() {
  // Best effort: shared instances live until the process exits; a
  // companion's queued work finishes before its scratch goes back.
  if (stream_) cudaStreamSynchronize(stream_);
  for (Tensor& t : scratch_) t = Tensor();
  if (lt_workspace_) device_release(lt_workspace_, index_);
  if (lt_) cublasLtDestroy(lt_);
  if (ring_) {
    if (ring_->base) cudaFreeHost(ring_->base);
    for (cudaEvent_t e : ring_->left)
      if (e) cudaEventDestroy(e);
    delete ring_;
  }
  free_capture_arena();
  if (transfer_) cudaStreamDestroy(transfer_);
  if (stream_) cudaStreamDestroy(stream_);
}

void cuda_backend::before_allocating() {
  if (!companion_) return;
  device_guard guard(index_);
  COROLLA_CUDA_CHECK(cudaDeviceSynchronize());
}

Tensor cuda_backend::empty(shape_t shape, dtype t) {
  before_allocating();
  return Tensor::empty(std::move(shape), t, dev());
}

Tensor cuda_backend::host_empty(shape_t shape, dtype t) {
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(t);
  void* p = nullptr;
  if (bytes == 0 || cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // no page-locked memory to be had: ordinary host memory
    return Tensor::empty(std::move(shape), t);
  }
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return Tensor::wrap(storage::borrow(p, bytes, std::move(owner)), 0, std::move(shape), t);
}

void cuda_backend::synchronize() {
  device_guard guard(index_);
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

namespace {

/// mark()'s event, destroyed with the last holder.
struct cuda_marker final : queue_marker {
  cudaEvent_t event = nullptr;
  int device = -1;
  ~cuda_marker() override {
    if (event) cudaEventDestroy(event);
  }
};

/// `after` as a marker of device `index` (null stays null), or a
/// tensor_error naming `op` and `backend`.
const cuda_marker* marker_of(const queue_marker* after, int index, const char* op, const std::string& backend) {
  if (after == nullptr) return nullptr;
  const auto* marker = dynamic_cast<const cuda_marker*>(after);
  if (marker == nullptr || marker->device != index)
    throw tensor_error(std::string(op) + ": the marker is not one of " + backend + "'s");
  return marker;
}

}  // namespace

std::shared_ptr<queue_marker> cuda_backend::mark() {
  device_guard guard(index_);
  auto m = std::make_shared<cuda_marker>();
  COROLLA_CUDA_CHECK(cudaEventCreateWithFlags(&m->event, cudaEventDisableTiming));
  m->device = index_;
  COROLLA_CUDA_CHECK(cudaEventRecord(m->event, stream_));
  return m;
}

void cuda_backend::copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) {
  if (!src.defined() || !dst.defined()) throw tensor_error("copy_after: tensor is undefined");
  if (src.numel() != dst.numel() || src.type() != dst.type())
    throw tensor_error("copy_after: " + shape_str(src.shape()) + " " + dtype_name(src.type()) + " into " +
                       shape_str(dst.shape()) + " " + dtype_name(dst.type()) +
                       " (it copies equal element counts of one dtype; copy() converts)");
  for (const Tensor* t : {&src, static_cast<const Tensor*>(&dst)})
    if (t->dev().kind != device_kind::cpu && t->dev() != dev())
      throw tensor_error("copy_after: the " + name() + " backend copies between the host and its own device (got " +
                         src.dev().str() + " -> " + dst.dev().str() + ")");
  const cuda_marker* marker = marker_of(after, index_, "copy_after", name());
  if (src.numel() == 0 || src.raw() == dst.raw()) return;
  device_guard guard(index_);
  std::lock_guard lock(transfer_mu_);
  if (transfer_ == nullptr) {
    // Non-blocking, unlike stream_: a blocking stream would also order with
    // every legacy-stream hook copy or memset the stage thread issues, which
    // would then wait for this whole copy. Nothing else needs ordering with
    // it: the copy is synchronised before returning, and its operands are
    // long-lived buffers the caller keeps other ops off (Backend::copy_after).
    cudaStream_t s = nullptr;
    COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    transfer_ = s;
  }
  if (marker) COROLLA_CUDA_CHECK(cudaStreamWaitEvent(transfer_, marker->event, 0));
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, transfer_));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(transfer_));
}

void cuda_backend::wait(const queue_marker* after) {
  const cuda_marker* marker = marker_of(after, index_, "wait", name());
  if (marker == nullptr) return;
  device_guard guard(index_);
  COROLLA_CUDA_CHECK(cudaEventSynchronize(marker->event));
}

void cuda_backend::release_cached_memory() { release_cached(index_); }

std::unique_ptr<Backend> cuda_backend::companion() {
  return std::unique_ptr<Backend>(new cuda_backend(index_, true));  // the private constructor
}

bool cuda_backend::has_device_groups() const {
#ifdef COROLLA_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

device_group_id cuda_backend::new_group_id() {
#ifdef COROLLA_HAVE_NCCL
  device_guard guard(index_);
  return make_nccl_unique_id();
#else
  return Backend::new_group_id();  // throws: built without NCCL
#endif
}

std::unique_ptr<device_group> cuda_backend::join_group(const device_group_id& id, int rank, int size,
                                                       const group_give_up& give_up) {
#ifdef COROLLA_HAVE_NCCL
  return std::make_unique<nccl_group>(id, rank, size, *this, give_up);
#else
  return Backend::join_group(id, rank, size, give_up);
#endif
}

void cuda_backend::upload_once(int slot, void* dst, const void* src, std::size_t bytes) {
  slot_upload& u = uploaded_[static_cast<std::size_t>(slot)];
  const auto* from = static_cast<const std::byte*>(src);
  if (u.at == dst && u.bytes.size() == bytes && std::memcmp(u.bytes.data(), from, bytes) == 0) return;
  u.at = nullptr;  // unknown should upload throw
  upload(dst, src, bytes);
  u.bytes.assign(from, from + bytes);
  u.at = dst;
}

void cuda_backend::forget_uploads() {
  for (slot_upload& u : uploaded_) u.at = nullptr;
}

void cuda_backend::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (capturing_) {  // the graph reads its own copy when it runs (step_graph.cpp)
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, stage_for_capture(src, bytes), bytes, cudaMemcpyHostToDevice, stream_));
    return;
  }
  if (ring_ == nullptr) {
    auto* r = new staging_ring;
    void* p = nullptr;
    if (cudaHostAlloc(&p, 2 * staging_ring::half, cudaHostAllocDefault) == cudaSuccess &&
        cudaEventCreateWithFlags(&r->left[0], cudaEventDisableTiming) == cudaSuccess &&
        cudaEventCreateWithFlags(&r->left[1], cudaEventDisableTiming) == cudaSuccess) {
      r->base = static_cast<unsigned char*>(p);
    } else {
      cudaGetLastError();  // no pinned memory (memlock limits): copy from pageable memory
      if (p) cudaFreeHost(p);
    }
    ring_ = r;
  }
  staging_ring& r = *ring_;
  if (r.base == nullptr || bytes > staging_ring::half / 8) {
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    return;
  }
  const std::size_t room = (bytes + 63) & ~std::size_t{63};
  if (r.offset + room > staging_ring::half) {
    COROLLA_CUDA_CHECK(cudaEventRecord(r.left[r.current], stream_));
    r.pending[r.current] = true;
    r.current ^= 1;
    r.offset = 0;
    if (r.pending[r.current]) {
      COROLLA_CUDA_CHECK(cudaEventSynchronize(r.left[r.current]));
      r.pending[r.current] = false;
    }
  }
  unsigned char* staged = r.base + static_cast<std::size_t>(r.current) * staging_ring::half + r.offset;
  std::memcpy(staged, src, bytes);
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, stream_));
  r.offset += room;
}

void* cuda_backend::scratch(int slot, std::size_t bytes) {
  Tensor& t = scratch_[slot];
  if (!t.defined() || t.nbytes() < bytes) {
    // Grow by at least half again, so slowly growing requests reallocate rarely.
    std::size_t want = t.defined() ? t.nbytes() + t.nbytes() / 2 : 0;
    if (want < bytes) want = bytes;
    if (want < 4096) want = 4096;
    t = Tensor();  // back to the cache first: the new block may reuse it
    uploaded_[static_cast<std::size_t>(slot)].at = nullptr;  // even at the same address, upload_once knows nothing of it
    before_allocating();
    t = Tensor::empty({static_cast<std::int64_t>(want)}, dtype::i8, dev());
  }
  return t.raw();
}

float* cuda_backend::column_partials(std::int64_t rows, std::int64_t cols, int sums) {
  const std::size_t bytes = column_partials_bytes(rows, cols, sums, column_chunking());
  return bytes ? static_cast<float*>(scratch(slot_reduce, bytes)) : nullptr;
}

cuda_backend::index_view cuda_backend::indices(const Tensor& t, std::int64_t n, int slot,
                                               const char* what) {
  if (!t.defined()) throw tensor_error(std::string(what) + ": tensor is undefined");
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(std::int32_t);
  if (t.dev().kind == device_kind::cpu) {
    require_on(t, device{}, dtype::i32, {n}, what);
    index_view v;
    v.host = t.data<std::int32_t>();
    void* d = scratch(slot, bytes);
    upload_once(slot, d, v.host, bytes);  // staged: the host tensor may change right after
    v.dev = static_cast<const std::int32_t*>(d);
    return v;
  }
  require_on(t, dev(), dtype::i32, {n}, what);
  host_indices_.resize(static_cast<std::size_t>(n));
  if (bytes) {
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(host_indices_.data(), t.raw(), bytes,
                                       cudaMemcpyDeviceToHost, stream_));
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return {host_indices_.data(), t.data<std::int32_t>()};
}

void cuda_backend::copy(const Tensor& src, Tensor& dst) {
  if (!src.defined() || !dst.defined()) throw tensor_error("copy: tensor is undefined");
  if (src.numel() != dst.numel())
    throw tensor_error("copy: " + shape_str(src.shape()) + " into " + shape_str(dst.shape()) +
                       " (element counts differ)");
  const bool src_host = src.dev().kind == device_kind::cpu;
  const bool dst_host = dst.dev().kind == device_kind::cpu;
  if (src_host && dst_host) {
    cpu_backend().copy(src, dst);
    return;
  }
  if (src.dev() != dev() && dst.dev() != dev())
    throw tensor_error("copy: the " + name() + " backend copies to or from its own device (got " +
                       src.dev().str() + " -> " + dst.dev().str() + ")");
  const dtype from = src.type(), to = dst.type();
  if (from != to && (!is_float_dtype(from) || !is_float_dtype(to)))
    throw tensor_error(std::string("copy: cannot convert ") + dtype_name(from) + " to " +
                       dtype_name(to));
  const std::int64_t n = src.numel();
  if (n == 0) return;
  device_guard guard(index_);
  if (from == to) {
    if (!src_host && !dst_host && src.dev().index != dst.dev().index) {
      COROLLA_CUDA_CHECK(cudaMemcpyPeerAsync(dst.raw(), dst.dev().index, src.raw(),
                                             src.dev().index, dst.nbytes(), stream_));
    } else if (src_host && capturing_) {
      upload(dst.raw(), src.raw(), dst.nbytes());  // staged: a graph cannot copy from pageable memory
    } else if (src.raw() != dst.raw()) {
      COROLLA_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, stream_));
    }
    if (dst_host) COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  if (!src_host && !dst_host && src.dev() != dst.dev())
    throw tensor_error("copy: converting " + std::string(dtype_name(from)) + " to " +
                       dtype_name(to) + " between two devices (" + src.dev().str() + " -> " +
                       dst.dev().str() + ") is not supported; copy, then convert on one device");
  if (src_host) {  // upload as is, convert on the device
    void* staging = scratch(slot_staging, src.nbytes());
    if (capturing_)
      upload(staging, src.raw(), src.nbytes());  // staged: a graph cannot copy from pageable memory
    else
      COROLLA_CUDA_CHECK(cudaMemcpyAsync(staging, src.raw(), src.nbytes(), cudaMemcpyHostToDevice, stream_));
    convert(stream_, staging, elem_for(from), dst.raw(), elem_for(to), n);
  } else if (dst_host) {  // convert on the device, download
    void* staging = scratch(slot_staging, dst.nbytes());
    convert(stream_, src.raw(), elem_for(from), staging, elem_for(to), n);
    COROLLA_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), staging, dst.nbytes(), cudaMemcpyDeviceToHost, stream_));
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    convert(stream_, src.raw(), elem_for(from), dst.raw(), elem_for(to), n);
  }
}

cuda_backend& backend_for_device(int index) {
  const int n = device_count();
  if (n == 0)
    throw std::runtime_error("device cuda:" + std::to_string(index) +
                             " requested but no CUDA device is visible (" + device_count_error() +
                             ")");
  if (index < 0 || index >= n)
    throw std::runtime_error("device cuda:" + std::to_string(index) + " requested but only " +
                             std::to_string(n) + " CUDA device(s) are visible");
  static std::mutex mutex;
  // Never destroyed: see the header.
  static auto* backends = new std::vector<cuda_backend*>();
  std::lock_guard<std::mutex> lock(mutex);
  if (backends->size() < static_cast<std::size_t>(n)) backends->resize(static_cast<std::size_t>(n));
  auto& b = (*backends)[static_cast<std::size_t>(index)];
  if (!b) b = new cuda_backend(index);
  return *b;
}

elem elem_of(dtype t, const char* what) {
  switch (t) {
    case dtype::f32: return elem::f32;
    case dtype::bf16: return elem::bf16;
    case dtype::f16: return elem::f16;
    default: throw tensor_error(std::string(what) + ": expected f32, bf16 or f16, got " + dtype_name(t));
  }
}

}  // namespace corolla::cuda
