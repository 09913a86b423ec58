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
#include <string>

#include "kernels/cuda/stream.hpp"
#include "kernels/device_group.hpp"
#include "kernels/tensor.hpp"

struct ncclComm;

namespace corolla::cuda {

class cuda_backend;

/// NCCL's unique id (ncclUniqueId, 128 bytes): made by one rank, sent to the
/// others out of band (the training job passes it along the group's ring).
using nccl_unique_id = device_group_id;

/// A new unique id (ncclGetUniqueId). Throws std::runtime_error on failure.
nccl_unique_id make_nccl_unique_id();

/// The version of the NCCL library loaded ("2.28.3", from ncclGetVersion;
/// needs no GPU), or why it cannot be had.
std::string nccl_version();

/// One rank's membership of an NCCL communicator on one backend's device
/// (cuda_backend::join_group makes these). Thread-compatible, like the
/// backend it uses: two threads may use it in turn (the training rank's DP
/// thread, then its stage thread) when something orders their calls
/// (there: the DP thread's synchronize before it reports the bucket
/// reduced). The communicator is non-blocking (ncclConfig_t blocking = 0),
/// so every wait on the other ranks is a poll that can give up: a dead rank
/// fails its peers (ncclCommAbort) instead of hanging them.
class nccl_group final : public device_group {
 public:
  /// Joins group `id` as `rank` of `n_ranks` on `backend`'s device. Returns
  /// once every rank has joined (ncclCommInitRankConfig, polled), asking
  /// `give_up` (may be empty) meanwhile. Throws std::runtime_error naming
  /// the NCCL status, or the reason to give up, on failure.
  nccl_group(const nccl_unique_id& id, int rank, int n_ranks, cuda_backend& backend,
             group_give_up give_up = {});
  ~nccl_group() override;
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return n_ranks_; }

  /// out = sum over ranks of in (same dtype and element count; out may be
  /// in), on `on`'s stream.
  void all_reduce(Backend& on, const Tensor& in, Tensor& out);
  /// device_group's, on `on`'s stream (a cuda_backend on this device).
  void reduce_scatter(Backend& on, const Tensor& in, Tensor& out) override;
  void all_gather(Backend& on, const Tensor& in, Tensor& out) override;
  /// Polls `on`'s stream (cudaStreamQuery) and the communicator's
  /// asynchronous error, asking give_up between polls.
  void synchronize(Backend& on) override;

 private:
  /// Waits while an NCCL call of this non-blocking communicator is in
  /// progress (ncclCommGetAsyncError); throws after aborting on an error
  /// or a reason to give up. `status` is the call's own return.
  void settle(int status, const char* call);
  /// Aborts the communicator (ncclCommAbort) and throws `why`.
  [[noreturn]] void abort_with(const std::string& why);
  /// Throws if the group was aborted.
  void check_alive(const char* what) const;
  /// The stream of `on`, checked to be a cuda_backend on this group's device.
  stream_t stream_of(Backend& on, const char* what) const;
  void check(const Tensor& t, const char* what) const;

  ncclComm* comm_ = nullptr;
  group_give_up give_up_;
  int device_ = 0;
  int rank_ = 0;
  int n_ranks_ = 1;
};

}  // namespace corolla::cuda
