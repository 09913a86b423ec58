// net/rdma_link.hpp — the RDMA path of one transport connection: the upgrade
// handshake over the connection's ZeroMQ path, and the switch markers that
// keep each direction's messages in order across the change of path.
//
// Handshake (control messages travel over ZeroMQ as oneway messages with no
// target actor and a type starting with "rdma."; docs/protocol.md):
//   connector                                acceptor
//   rdma.offer  (its QP address)  ------->   creates and connects its QP
//               <-------  rdma.accept (its QP address)   or rdma.refuse (why)
//   connects its QP
//   rdma.ready  ------->  (connector's data goes over RDMA from here on)
//               <-------  rdma.switch (acceptor's data over RDMA from here on)
// A side delivers what arrives over RDMA only after the other side's marker
// (ready or switch) came over ZeroMQ, so everything the peer sent before
// switching has been delivered first; RDMA messages that overtake the
// marker are held until it arrives.
//
// A failed work request ends the RDMA path of this TCP connection: the side
// that saw it sends rdma.down (over ZeroMQ) so the peer drains what arrived
// and falls back too; later sends go over ZeroMQ and offers are refused
// until the TCP connection itself is reset.
// Belongs to the transport's I/O thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/codec.hpp"
#include "net/message.hpp"
#include "net/rdma_verbs.hpp"

namespace corolla::net::rdma {

class channel;

/// The RDMA path of one transport connection (see the file comment): sets it
/// up with the peer, sends this side's messages over it and delivers the
/// peer's in order.
class link {
 public:
  /// What the link needs of its connection; called from inside the link's own
  /// calls. All but `admit` must be set.
  struct hooks {
    /// Sends a control message over the connection's ZeroMQ path.
    std::function<void(message&&)> send_control;
    /// A message received over RDMA, in order.
    std::function<void(message&&)> deliver;
    /// Frames received over RDMA that failed validation.
    std::function<void(const std::string& reason)> bad;
    /// The path changed: up (both directions over RDMA) or down (why).
    std::function<void(bool up, const std::string& reason)> changed;
    /// Asked before a queue pair is created: "" to go ahead, else why not
    /// (e.g. the node's limit of queue pairs). Optional.
    std::function<std::string()> admit;
  };

  /// `dev` may be null (this node has no RDMA device): offers are refused.
  link(std::shared_ptr<device> dev, decode_limits limits, bool checksums, hooks h);
  ~link();

  /// True for the control messages this class handles.
  static bool is_control(const message& m);

  /// Connector side: creates the queue pair and sends rdma.offer.
  void offer();
  /// Handles one control message from the peer.
  void on_control(const message& m);
  /// This side's data goes over RDMA.
  bool sending() const { return state_ == state::up; }
  /// Queues encoded frames on the RDMA path (only while sending()).
  void send(std::vector<out_frame> frames);
  /// The RDMA path holds as much as it should (messages waiting for
  /// credits, or rendezvous memory the peer has not read yet): the
  /// transport keeps further messages in its own queue (backpressure).
  bool backlog_full() const;
  /// Whether a queue pair exists (set up, or being set up).
  bool has_queue_pair() const { return channel_ != nullptr; }
  /// Drives the queue pair. Returns false when the path failed just now
  /// (changed(false, ...) has been called, the peer was sent rdma.down, and
  /// the path is gone).
  bool progress();
  /// True once after the path broke in a way that may have lost messages
  /// (a failed work request, the peer's rdma.down, a repeated offer): the
  /// transport then reports the connection down and up.
  bool take_failure();
  /// Descriptor to poll for completions (-1 without a queue pair).
  int event_fd() const;
  /// Re-arms the descriptor (nothing without a queue pair); call progress() after it.
  void arm();
  /// Drops the queue pair (the TCP connection is gone, the peer may be
  /// dead), reporting changed(false) if a path was set up or on its way; a
  /// later offer may set the path up again, even after a failure.
  void reset();
  /// RDMA messages sent so far on this connection.
  std::uint64_t messages_sent() const;
  /// RDMA messages received, over every queue pair it had (held ones included).
  std::uint64_t messages_received() const;

 private:
  enum class state { idle, offered, accepted, up };
  void drop(const std::string& why, bool report);
  void fail(const std::string& why, bool tell_peer);
  void refuse(const std::string& why);
  void control(const char* type, std::vector<std::uint8_t> body);
  void flush_held();

  std::shared_ptr<device> dev_;
  decode_limits limits_;
  bool checksums_;
  hooks hooks_;
  state state_ = state::idle;
  bool peer_switched_ = false;
  std::string failed_;  // why RDMA broke on this connection (until the TCP connection is reset)
  bool failure_pending_ = false;
  std::unique_ptr<channel> channel_;
  std::deque<message> held_;
  std::uint64_t sent_before_ = 0, received_before_ = 0;  // of channels already dropped
};

}  // namespace corolla::net::rdma
