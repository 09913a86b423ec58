// kernels/device_group.hpp — collectives among backends on different
// devices, run by the devices themselves (NCCL on CUDA), so a
// data-parallel group whose members all compute on devices reduces its
// gradients without the host. Host-only. Backend::new_group_id and
// Backend::join_group make them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "kernels/tensor.hpp"

namespace corolla {

class Backend;

/// Names one group (NCCL's 128-byte unique id): one member makes it
/// (Backend::new_group_id) and sends it to the others out of band.
using device_group_id = std::array<std::uint8_t, 128>;

/// Asked again and again while a member waits for the others (joining,
/// device_group::synchronize): a reason to stop waiting (a member is known
/// to be gone, the job failed), or nothing to go on waiting. Empty: wait.
using group_give_up = std::function<std::optional<std::string>()>;

/// One member's handle on a group of `size()` devices, member `rank()`.
/// Every member must call the same collectives in the same order with
/// matching sizes (NCCL's rule: a mismatch hangs rather than fails). A
/// collective is queued on backend `on` (one on this member's device: the
/// instance it joined with or a companion of it) in order with that
/// backend's ops, and returns at once, like an op.
class device_group {
 public:
  virtual ~device_group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// out (k values) = chunk rank() of the sum over members of in (size() * k
  /// values): elements [rank() * k, (rank() + 1) * k). Same dtype; in and
  /// out must not overlap.
  virtual void reduce_scatter(Backend& on, const Tensor& in, Tensor& out) = 0;
  /// out (size() * k values) = every member's in (k values), in rank order.
  /// Same dtype; in and out must not overlap.
  virtual void all_gather(Backend& on, const Tensor& in, Tensor& out) = 0;
  /// Returns once everything queued on `on` so far, this group's
  /// collectives included, has finished. While it waits it asks the
  /// group's give-up function (join_group's); on a reason, or an error the
  /// group reports (NCCL's asynchronous errors), it aborts the group (every
  /// later call on it throws) and throws std::runtime_error saying why. A
  /// member that died mid-collective thus fails its peers instead of
  /// hanging them.
  virtual void synchronize(Backend& on) = 0;
};

}  // namespace corolla
