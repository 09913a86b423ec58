// kernels/cuda/nccl_comm.hpp — collectives on device tensors through NCCL
// (host-only: no NCCL or CUDA headers). Built only when nccl.h and libnccl
// are found (COROLLA_HAVE_NCCL).
//
// Every collective is enqueued on the backend's stream and returns at once,
// like the backend's ops: the result is ready for the next op on that
// backend, and on the host after Backend::synchronize(). All ranks must
// call the same collectives in the same order with matching sizes (NCCL's
// rule; a mismatch hangs rather than fails).
#pragma once

#include <array>
#include <cstddef>

#include "kernels/tensor.hpp"

struct ncclComm;

namespace corolla::cuda {

class cuda_backend;

/// NCCL's unique id (ncclUniqueId, 128 bytes): made by one rank, sent to the
/// others out of band (e.g. in the training roster).
using nccl_unique_id = std::array<char, 128>;

/// A new unique id (ncclGetUniqueId). Throws std::runtime_error on failure.
nccl_unique_id make_nccl_unique_id();

/// One rank's membership of an NCCL communicator on one backend's device.
/// Thread-compatible, like the backend it uses.
class nccl_group {
 public:
  /// Joins group `id` as `rank` of `n_ranks` on `backend`'s device. Blocks
  /// until every rank has joined (ncclCommInitRank). Throws
  /// std::runtime_error naming the NCCL status on failure.
  nccl_group(const nccl_unique_id& id, int rank, int n_ranks, cuda_backend& backend);
  ~nccl_group();
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  int rank() const { return rank_; }
  int size() const { return n_ranks_; }

  /// out = sum over ranks of in (same dtype and element count; out may be in).
  void all_reduce(const Tensor& in, Tensor& out);
  /// out (n / size elements) = this rank's slice of the sum over ranks of
  /// in (n elements): rank r gets elements [r*n/size, (r+1)*n/size).
  void reduce_scatter(const Tensor& in, Tensor& out);
  /// out (n * size elements) = every rank's in (n elements), in rank order.
  void all_gather(const Tensor& in, Tensor& out);

 private:
  void check(const Tensor& t, const char* what) const;

  ncclComm* comm_ = nullptr;
  cuda_backend* backend_ = nullptr;
  int rank_ = 0;
  int n_ranks_ = 1;
};

}  // namespace corolla::cuda
