// kernels/cuda/nccl_comm.cpp — the NCCL wrapper (see nccl_comm.hpp). Every
// NCCL call's status is checked and turned into an exception naming the
// call, file:line and ncclGetErrorString.
#include "kernels/cuda/nccl_comm.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(nccl_unique_id), "ncclUniqueId size changed");

[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file,
                                   int line) {
  throw std::runtime_error(std::string("NCCL error: ") + call + " at " + file + ":" +
                           std::to_string(line) + ": " + ncclGetErrorString(status));
}

#define COROLLA_NCCL_CHECK(call)                                              \
  do {                                                                        \
    const ncclResult_t corolla_status_ = (call);                              \
    if (corolla_status_ != ncclSuccess)                                       \
      throw_nccl_error(corolla_status_, #call, __FILE__, __LINE__);           \
  } while (0)

ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
    case dtype::i32: return ncclInt32;
    case dtype::i8: return ncclInt8;
  }
  throw tensor_error("nccl: unknown dtype");
}

}  // namespace

nccl_unique_id make_nccl_unique_id() {
  ncclUniqueId id;
  COROLLA_NCCL_CHECK(ncclGetUniqueId(&id));
  nccl_unique_id out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::string nccl_version() {
  int v = 0;
  if (const ncclResult_t r = ncclGetVersion(&v); r != ncclSuccess)
    return std::string("unknown (") + ncclGetErrorString(r) + ")";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

nccl_group::nccl_group(const nccl_unique_id& id, int rank, int n_ranks, cuda_backend& backend,
                       group_give_up give_up)
    : give_up_(std::move(give_up)), device_(backend.dev().index), rank_(rank), n_ranks_(n_ranks) {
  if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
    throw std::invalid_argument("nccl_group: rank " + std::to_string(rank) + " of " +
                                std::to_string(n_ranks) + " ranks");
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  device_guard guard(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below is a poll that can give up
  ncclComm_t comm = nullptr;
  const ncclResult_t status = ncclCommInitRankConfig(&comm, n_ranks, nid, rank, &config);
  comm_ = comm;
  if (comm_ == nullptr) throw_nccl_error(status, "ncclCommInitRankConfig", __FILE__, __LINE__);
  settle(status, "ncclCommInitRankConfig");
}

nccl_group::~nccl_group() {
  if (comm_ == nullptr) return;  // aborted
  // Statuses ignored: nothing to do with them here. A non-blocking
  // communicator finalises asynchronously; one that does not within 10 s
  // (a peer gone) is aborted instead.
  device_guard guard(device_);
  ncclResult_t state = ncclCommFinalize(comm_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
  }
  if (state == ncclSuccess) ncclCommDestroy(comm_);
  else ncclCommAbort(comm_);
}

void nccl_group::abort_with(const std::string& why) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);  // its status does not change what is thrown
    comm_ = nullptr;
  }
  throw std::runtime_error("NCCL group of cuda:" + std::to_string(device_) + " (member " +
                           std::to_string(rank_) + " of " + std::to_string(n_ranks_) + ") aborted: " + why);
}

void nccl_group::check_alive(const char* what) const {
  if (comm_ == nullptr)
    throw std::runtime_error(std::string(what) + ": the NCCL group was aborted after an earlier failure");
}

void nccl_group::settle(int status_in, const char* call) {
  auto status = static_cast<ncclResult_t>(status_in);
  while (status == ncclInProgress) {
    if (give_up_)
      if (std::optional<std::string> why = give_up_()) abort_with(std::string(call) + " gave up: " + *why);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (const ncclResult_t q = ncclCommGetAsyncError(comm_, &status); q != ncclSuccess) status = q;
  }
  if (status != ncclSuccess)
    abort_with(std::string(call) + " failed: " + ncclGetErrorString(status) + " (" + ncclGetLastError(comm_) + ")");
}

void nccl_group::synchronize(Backend& on) {
  cudaStream_t s = stream_of(on, "synchronize");
  check_alive("synchronize");
  device_guard guard(device_);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) COROLLA_CUDA_CHECK(q);
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress)
      abort_with(std::string("a collective failed: ") + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) +
                 ")");
    if (give_up_)
      if (std::optional<std::string> why = give_up_()) abort_with("waiting for its collectives gave up: " + *why);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

stream_t nccl_group::stream_of(Backend& on, const char* what) const {
  auto* cuda = dynamic_cast<cuda_backend*>(&on);
  if (cuda == nullptr || on.dev().index != device_)
    throw tensor_error(std::string(what) + ": NCCL ops of the group on cuda:" + std::to_string(device_) +
                       " run on a backend of that device, not " + on.name());
  return cuda->stream();
}

void nccl_group::check(const Tensor& t, const char* what) const {
  require_on_device(t, corolla::device{device_kind::cuda, device_}, what);
}

void nccl_group::all_reduce(Backend& on, const Tensor& in, Tensor& out) {
  cudaStream_t s = stream_of(on, "all_reduce");
  check(in, "all_reduce in");
  check(out, "all_reduce out");
  require_condition(in.type() == out.type() && in.numel() == out.numel(), "all_reduce",
                    "in and out must have the same dtype and element count");
  device_guard guard(device_);
  check_alive("all_reduce");
  settle(ncclAllReduce(in.raw(), out.raw(), static_cast<std::size_t>(in.numel()), nccl_type(in.type()), ncclSum,
                       comm_, s),
         "ncclAllReduce");
}

void nccl_group::reduce_scatter(Backend& on, const Tensor& in, Tensor& out) {
  cudaStream_t s = stream_of(on, "reduce_scatter");
  check(in, "reduce_scatter in");
  check(out, "reduce_scatter out");
  require_condition(in.type() == out.type(), "reduce_scatter", "in and out must share a dtype");
  require_condition(in.numel() == out.numel() * n_ranks_, "reduce_scatter",
                    "in must hold size() times out's elements");
  device_guard guard(device_);
  check_alive("reduce_scatter");
  settle(ncclReduceScatter(in.raw(), out.raw(), static_cast<std::size_t>(out.numel()), nccl_type(in.type()),
                           ncclSum, comm_, s),
         "ncclReduceScatter");
}

void nccl_group::all_gather(Backend& on, const Tensor& in, Tensor& out) {
  cudaStream_t s = stream_of(on, "all_gather");
  check(in, "all_gather in");
  check(out, "all_gather out");
  require_condition(in.type() == out.type(), "all_gather", "in and out must share a dtype");
  require_condition(out.numel() == in.numel() * n_ranks_, "all_gather",
                    "out must hold size() times in's elements");
  device_guard guard(device_);
  check_alive("all_gather");
  settle(ncclAllGather(in.raw(), out.raw(), static_cast<std::size_t>(in.numel()), nccl_type(in.type()), comm_, s),
         "ncclAllGather");
}

}  // namespace corolla::cuda
