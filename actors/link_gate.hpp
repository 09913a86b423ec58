// actors/link_gate.hpp — the part of a link that other threads may use
// without waking its actor (internal to the runtime).
//
// A decode step through a swarm crosses several threads per hop (ZeroMQ's
// I/O thread, the transport's, a CAF worker for the link actor, the target
// actor's, and the same back out); on a busy machine each wake-up costs tens
// of microseconds. While a link is up, its gate lets the transport's I/O
// thread hand the peer's one-way messages straight to their target actor,
// and lets node::post hand one-way messages straight to the transport, with
// the link's checks (the sender's node id, the peer's announced limits,
// partitions) and counters kept. Everything else stays with the link actor:
// hellos, heartbeats, requests and their answers, errors, and every message
// while the link is not up.
//
// The link actor opens the gate when the peer is up and closes it when the
// peer goes down, the link leaves or closes, or the peer changes identity.
//
// Order is kept per stream. The I/O thread counts the messages it hands the
// link actor (inbound_queued) and takes the gate only while the actor has
// handled every one of them, so a one-way message never overtakes an earlier
// message of the same connection; node::post does the same with the posts it
// hands the actor (outbound_queued).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/error.hpp>

#include "actors/messages.hpp"
#include "net/message.hpp"
#include "net/zmq_transport.hpp"

namespace corolla {

struct node_context;

/// What a peer's hello said it takes, and where it is reached.
struct peer_terms {
  std::string peer;  ///< node id
  net::connection_id conn = 0;
  std::vector<std::string> capabilities;
  std::uint64_t max_message_bytes = 0;  ///< 0 = not announced
};

/// Whether a peer with `terms` takes `rm`: every frame within its announced
/// largest message, and int8 tensors only when it announced "int8-tensors".
/// Error: errc::send_failed, with the reason.
caf::error check_peer_accepts(const peer_terms& terms, const remote_message& rm);

/// Bytes of body and tensor frames as they travel: an int8_block tensor
/// counts its int8 values and f32 scales, not the f32 tensor it stands for.
std::uint64_t payload_bytes(const net::message& m);

/// What a message from node `from_node` delivers to its actor: its type,
/// body, tensors and encodings (moved out of `m`) and who sent it.
remote_message delivered(net::message& m, const std::string& from_node);
/// The wire message of `kind` carrying `rm` (moved out of it): type, body,
/// tensors and encodings; the caller fills in the rest.
net::message wire_message(net::message_kind kind, remote_message& rm);

class link_gate {
 public:
  using clock = std::chrono::steady_clock;

  /// The link is up with the peer in `terms` (its direct connection).
  void open(peer_terms terms);
  /// The link is not up (or is leaving): everything goes through its actor.
  void close();
  /// The terms while open, else null.
  std::shared_ptr<const peer_terms> terms() const;

  /// Messages the I/O thread handed the link actor that it has not handled
  /// yet, and posts handed to it that it has not sent yet.
  std::atomic<std::uint32_t> inbound_queued{0}, outbound_queued{0};

  /// Traffic that went through the gate (the link adds it to its own).
  void count_received(std::uint64_t bytes);
  void count_sent(std::uint64_t bytes);
  struct traffic {
    std::uint64_t messages_sent = 0, messages_received = 0, bytes_sent = 0, bytes_received = 0;
  };
  traffic totals() const;
  /// Bytes received and sent since the last call (the link's rate windows).
  std::pair<std::uint64_t, std::uint64_t> take_window();
  /// When the gate last delivered a message (epoch if never).
  clock::time_point last_received() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const peer_terms> terms_;
  std::atomic<clock::rep> last_rx_{0};
  std::atomic<std::uint64_t> messages_sent_{0}, messages_received_{0}, bytes_sent_{0}, bytes_received_{0};
  std::atomic<std::uint64_t> window_sent_{0}, window_received_{0};
};

/// On the transport's I/O thread: delivers `m`, a message from `gate`'s
/// connection, to its target actor when the gate may take it (a one-way
/// message, the gate open, nothing of the connection still queued at the
/// link actor, the sender named as the peer, the target published, no
/// partition). Returns false, with `m` untouched, when the link actor must
/// have it.
bool deliver_through_gate(node_context& ctx, link_gate& gate, net::message& m);

/// Sends `rm` one-way to actor `target` on the gate's peer, as actor
/// `sender`, straight to the transport when the gate may take it. Returns
/// false, with `rm` untouched, when the link actor must send it; else the
/// outcome in `error` (none when sent, or dropped by a partition).
bool post_through_gate(node_context& ctx, link_gate& gate, const std::string& target, const std::string& sender,
                       remote_message& rm, caf::error& error);

}  // namespace corolla
