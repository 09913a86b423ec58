// net/rdma_fake.hpp — an in-process RDMA fabric for tests (see
// net/rdma_verbs.hpp): queue pairs of devices opened on the same fabric
// connect to each other by queue pair number and move bytes with memcpy.
//
// It enforces what the RDMA protocol must respect on real hardware, and
// reports a violation as a failed completion (as a real queue pair would
// fail) or, for a bad post, an exception: a send needs a receive posted by
// the peer (the protocol's credits guarantee one; verbs would stall in RNR
// retries), a message must fit the posted buffer, local buffers must lie in
// a registration of the queue pair with its lkey (and local write access for
// receives and READ targets), a READ needs the peer's rkey, a range inside
// its registration and remote read access, and nothing moves unless both
// sides are connected to each other. Work requests run later, in post
// order, when any queue pair polls, so the bytes are taken after the post
// as a NIC would take them. Thread-safe: each side's I/O thread posts on its
// own queue pair, and the fabric delivers into the peer's under one lock.
#pragma once

#include <memory>
#include <string>

#include "net/rdma_verbs.hpp"

namespace corolla::net::rdma {

/// An in-process fabric: devices opened on it reach each other's queue pairs.
/// Thread-safe (one lock per fabric).
class fake_fabric {
 public:
  /// A new fabric, with no device yet.
  static std::shared_ptr<fake_fabric> create();
  virtual ~fake_fabric() = default;
  /// A device on this fabric, announcing itself as a NIC of `kind`
  /// (infiniband or roce) named "fake<N>:1".
  virtual std::shared_ptr<device> open_device(nic_kind kind = nic_kind::infiniband) = 0;
  /// From now on every work request the fabric carries out completes with
  /// `reason` as its error (a broken link), also one posted before the call
  /// and not yet run; "" heals it.
  virtual void fail_all(const std::string& reason) = 0;
  /// While stalled, posted work requests wait (in post order) instead of
  /// running at the next poll, as on a congested link; unstalling wakes
  /// every queue pair's poller.
  virtual void stall(bool on) = 0;
  /// Work requests carried so far: sends, READs, and their bytes.
  struct counters {
    std::uint64_t sends = 0, reads = 0, send_bytes = 0, read_bytes = 0;
  };
  /// The counters so far (transfers that succeeded).
  virtual counters stats() const = 0;
};

}  // namespace corolla::net::rdma
