// kernels/cuda/nccl_comm.cpp — the NCCL wrapper (see nccl_comm.hpp). Every
// NCCL call's status is checked and turned into an exception naming the
// call, file:line and ncclGetErrorString.
#include "kernels/cuda/nccl_comm.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>
#include <string>

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

nccl_group::nccl_group(const nccl_unique_id& id, int rank, int n_ranks, cuda_backend& backend)
    : device_(backend.dev().index), rank_(rank), n_ranks_(n_ranks) {
  if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
    throw std::invalid_argument("nccl_group: rank " + std::to_string(rank) + " of " +
                                std::to_string(n_ranks) + " ranks");
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  device_guard guard(device_);
  ncclComm_t comm = nullptr;
  COROLLA_NCCL_CHECK(ncclCommInitRank(&comm, n_ranks, nid, rank));
  comm_ = comm;
}

nccl_group::~nccl_group() {
  if (comm_) ncclCommDestroy(comm_);  // status ignored: nothing to do with it here
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
  COROLLA_NCCL_CHECK(ncclAllReduce(in.raw(), out.raw(), static_cast<std::size_t>(in.numel()),
                                   nccl_type(in.type()), ncclSum, comm_, s));
}

void nccl_group::reduce_scatter(Backend& on, const Tensor& in, Tensor& out) {
  cudaStream_t s = stream_of(on, "reduce_scatter");
  check(in, "reduce_scatter in");
  check(out, "reduce_scatter out");
  require_condition(in.type() == out.type(), "reduce_scatter", "in and out must share a dtype");
  require_condition(in.numel() == out.numel() * n_ranks_, "reduce_scatter",
                    "in must hold size() times out's elements");
  device_guard guard(device_);
  COROLLA_NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<std::size_t>(out.numel()),
                                       nccl_type(in.type()), ncclSum, comm_, s));
}

void nccl_group::all_gather(Backend& on, const Tensor& in, Tensor& out) {
  cudaStream_t s = stream_of(on, "all_gather");
  check(in, "all_gather in");
  check(out, "all_gather out");
  require_condition(in.type() == out.type(), "all_gather", "in and out must share a dtype");
  require_condition(out.numel() == in.numel() * n_ranks_, "all_gather",
                    "out must hold size() times in's elements");
  device_guard guard(device_);
  COROLLA_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), static_cast<std::size_t>(in.numel()),
                                   nccl_type(in.type()), comm_, s));
}

}  // namespace corolla::cuda
