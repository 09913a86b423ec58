// net/rdma_verbs.hpp — what the RDMA transport needs of a verbs device: a
// reliable-connected (RC) queue pair with its own completion queue, memory
// registration, two-sided sends into posted receives, and one-sided RDMA
// READs.
//
// Two implementations sit behind this interface:
//   * open_verbs_device(): libibverbs (rdma-core) on a real InfiniBand or
//     RoCE port;
//   * fake_fabric (net/rdma_fake.hpp): in-process queue pairs that move bytes
//     with memcpy and enforce the verbs rules the protocol depends on (a
//     send needs a posted receive, a READ needs a valid rkey and bounds,
//     completions arrive in order). Tests run the transport's RDMA protocol
//     on it; no RDMA hardware is needed.
// Nothing in here is thread-safe: a queue pair belongs to the transport's
// I/O thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/nic.hpp"

namespace corolla::net::rdma {

/// What one side of an RC connection tells the other (travels in the
/// transport's rdma.offer / rdma.accept bodies, 36 bytes).
struct qp_address {
  std::uint32_t qpn = 0;                ///< queue pair number
  std::uint32_t psn = 0;                ///< first packet sequence number (24 bits)
  std::uint16_t lid = 0;                ///< InfiniBand local id (0 on RoCE)
  std::uint8_t port = 0;                ///< verbs port the QP is bound to
  std::uint8_t mtu = 0;                 ///< ibv_mtu enum value of the port's active MTU
  std::array<std::uint8_t, 16> gid{};   ///< RoCE: the port's GID (all zero on InfiniBand)
  std::uint32_t max_read_size = 0;      ///< largest single READ this side's device does
  /// READs this side answers at once (the device's max_qp_rd_atom); the
  /// peer issues at most this many.
  std::uint8_t max_dest_reads = 0;
  std::uint8_t roce = 0;                ///< 1: RoCE (Ethernet link layer), 0: InfiniBand

  /// The 36-byte body decode() reads: the fields in order, in host byte
  /// order (little-endian hosts only).
  std::vector<std::uint8_t> encode() const;
  /// Throws std::invalid_argument for a body that is not 36 bytes.
  static qp_address decode(const std::uint8_t* data, std::size_t size);
};

/// What a registration allows (bit flags).
enum access : unsigned {
  local_write = 1,  ///< the device writes into it (receive slots, READ targets)
  remote_read = 2,  ///< the peer READs from it (rendezvous frames)
};

/// Keys of one registered memory range.
struct memory_keys {
  std::uint32_t lkey = 0;  ///< names the range in this side's work requests
  std::uint32_t rkey = 0;  ///< what the peer's READs of the range present
};

/// One work completion.
struct completion {
  /// The kind of work request.
  enum class op : std::uint8_t { send, recv, read };
  std::uint64_t wr_id = 0;  ///< as the work request was posted
  op what = op::send;  ///< unreliable when !ok (verbs leaves it undefined): use wr_id
  bool ok = true;  ///< false: the request failed (`error`)
  std::uint32_t bytes = 0;  ///< recv: bytes received
  std::string error;        ///< !ok: ibv_wc_status_str or the fake's reason
};

/// A reliable-connected queue pair with one completion queue for both
/// directions. Every post throws std::runtime_error (with the verbs error)
/// when the work request cannot be queued.
class queue_pair {
 public:
  virtual ~queue_pair() = default;
  /// This side's address for the peer (valid from creation).
  virtual qp_address local_address() const = 0;
  /// Moves the QP to ready-to-send against the peer's address
  /// (INIT -> RTR -> RTS). Throws with the verbs error.
  virtual void connect(const qp_address& remote) = 0;
  /// Registers [data, data + size) with `access` (access flags). Memory
  /// that is only read remotely is registered without local write, so
  /// read-only and file-backed mappings (mmap'd weights) can be registered.
  virtual memory_keys register_memory(void* data, std::size_t size, unsigned access) = 0;
  /// Releases a registration made by register_memory.
  virtual void deregister(const memory_keys& keys) = 0;
  /// Posts a receive of up to `size` bytes into `buffer` (registered with
  /// `lkey`, local write); a SEND from the peer completes it.
  virtual void post_recv(std::uint64_t wr_id, void* buffer, std::uint32_t size, std::uint32_t lkey) = 0;
  /// Posts a signaled SEND of [data, data + size) (registered with `lkey`);
  /// it lands in the peer's oldest posted receive.
  virtual void post_send(std::uint64_t wr_id, const void* data, std::uint32_t size, std::uint32_t lkey) = 0;
  /// Posts a signaled RDMA READ of `size` bytes at the peer's `remote_addr`
  /// (registered there with `rkey`, remote read) into `local` (`lkey`, local
  /// write).
  virtual void post_read(std::uint64_t wr_id, void* local, std::uint32_t size, std::uint32_t lkey,
                         std::uint64_t remote_addr, std::uint32_t rkey) = 0;
  /// Takes up to `max` completions without blocking; returns how many.
  virtual int poll(completion* out, int max) = 0;
  /// A file descriptor that becomes readable when completions may be
  /// waiting once arm() was called (a verbs completion channel, or the
  /// fake's eventfd).
  virtual int event_fd() const = 0;
  /// Consumes the descriptor's pending events and re-arms notification;
  /// poll() again afterwards (completions that raced the re-arm are there).
  virtual void arm() = 0;
};

/// An opened verbs device port.
class device {
 public:
  virtual ~device() = default;
  /// A new queue pair on this port taking up to `depth` sends and `depth`
  /// receives at once (the fake ignores it). Throws std::runtime_error.
  virtual std::unique_ptr<queue_pair> create_queue_pair(int depth) = 0;
  /// "mlx5_0:1" (or "fake0:1").
  virtual std::string name() const = 0;
  /// The port as a NIC (kind infiniband or roce, active, bandwidth).
  virtual nic_info nic() const = 0;
};

/// Opens `name` ("mlx5_0", or "" for the first device with an active port)
/// at `port` (0 = its first active port). Throws std::runtime_error saying
/// why when there is no such device, no active port, or this build has no
/// libibverbs ("built without libibverbs (rdma-core)").
std::unique_ptr<device> open_verbs_device(const std::string& name = "", int port = 0);

}  // namespace corolla::net::rdma
