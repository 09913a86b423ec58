// net/outbox.hpp — the order in which one connection's messages go out:
// lanes, barriers, and the fragments of large messages.
//
// A connection used to be one FIFO, so a heartbeat sent while a 1 GiB
// tensor was on its way waited for the whole tensor, and the peer's failure
// detector, hearing nothing, declared a healthy node dead. The outbox keeps
// the order that matters and no more:
//   * lanes: messages of one lane leave in the order they were sent. A lane
//     is a (sender actor, target actor) pair for requests and one-way
//     messages (CAF's own ordering guarantee between two actors), one
//     request or answer for anonymous requesters and for responses and
//     errors (each is matched by its correlation id), and one lane for the
//     link's heartbeats and hellos;
//   * barriers (goodbye, and the RDMA path's switch messages) leave only
//     after everything sent before them, and nothing sent after them
//     overtakes them;
//   * a message larger than the fragment size leaves as fragments
//     (net/fragment.hpp); small messages of other lanes go out between two
//     fragments, and large messages of different lanes take turns.
// Pure bookkeeping, no sockets or clocks: the transport asks next() when the
// link can take more (net/zmq_send.cpp), and the unit tests drive it
// directly. Not thread-safe (the transport's I/O thread owns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "net/codec.hpp"
#include "net/message.hpp"
#include "net/shaping.hpp"

namespace corolla::net {

/// One encoded message (or fragment) on its way out of a connection.
struct out_message {
  std::vector<out_frame> frames;
  std::size_t bytes = 0;
  std::uint64_t lane = 0;  ///< lane_of() of the message
  bool barrier = false;    ///< leaves after everything before it (goodbye, RDMA control)
  bool tcp_only = false;   ///< over ZeroMQ whatever the path (RDMA control, fragments)
  bool fragment = false;   ///< a fragment: its payload frames count toward the bulk window
  /// Counts toward the connection's queue depth (a whole message, or the
  /// last fragment of a large one).
  bool last = true;
  shaping_clock::time_point due{};  ///< send() time until shaping sets the delivery time
};

/// The lane of `m` (see the file comment). Lane 0 is the link's own
/// control traffic (hello, heartbeat and their answers).
std::uint64_t lane_of(const message& m);
/// Whether `m` must wait for everything sent before it (goodbye).
bool is_barrier(const message& m);

class outbox {
 public:
  /// Messages of more than `fragment_bytes` + 1/16 of it leave in fragments
  /// of `fragment_bytes` (0: never fragment).
  explicit outbox(std::size_t fragment_bytes = std::size_t{1} << 20);

  /// Changes the fragment size for what is pushed and cut from now on (a
  /// large message already started goes on in pieces of the new size).
  void set_fragment_bytes(std::size_t n) { fragment_bytes_ = n; }
  std::size_t fragment_bytes() const { return fragment_bytes_; }

  void push(out_message&& m);
  bool empty() const { return q_.empty(); }
  /// Messages waiting (a large one counts once until its last fragment left).
  std::size_t size() const { return q_.size(); }

  /// The next unit to put on the link: a whole small message when one may
  /// go (the earliest sent), else the next fragment of a large one, taking
  /// the large messages of different lanes in turn. `bulk` false holds
  /// large messages back (the link already carries enough of them);
  /// `fragment` false sends a large message not yet started whole (the RDMA
  /// path moves it without interleaving). Nothing when nothing may go now.
  std::optional<out_message> next(bool bulk, bool fragment = true);

  /// Whether next(false) would return something: a small message may go.
  bool small_ready() const;

  /// Drops the large messages that have started to leave: the connection
  /// broke, so the peer drops the part it has and would refuse the rest.
  /// Returns how many were dropped.
  std::size_t drop_started();
  /// Drops everything (message ids keep counting up).
  void clear() { q_.clear(); }

  /// Fragments handed out so far, and the large messages they belonged to.
  std::uint64_t fragments_sent() const { return fragments_; }
  std::uint64_t fragmented_messages() const { return next_id_ - 1; }

 private:
  struct entry {
    out_message m;
    bool large = false;
    std::uint64_t id = 0;  ///< fragment message id once started, else 0
    std::size_t frame = 0, offset = 0;  ///< the next byte to send
    std::uint64_t position = 0;
    std::uint64_t seq = 0;  ///< send order
  };
  /// Index of the earliest small message that may go; when there is none,
  /// `large` (if given) gets the large ones that may continue (each the
  /// first message of its lane).
  std::optional<std::size_t> eligible(std::vector<std::size_t>* large) const;
  out_message cut(entry& e);

  std::size_t fragment_bytes_;
  std::deque<entry> q_;
  std::uint64_t next_id_ = 1;
  std::uint64_t last_turn_ = 0;  ///< send order (seq) of the large message served last
  std::uint64_t seq_ = 0;
  std::uint64_t fragments_ = 0;
  mutable std::vector<std::uint64_t> seen_;  ///< eligible()'s scratch
  std::vector<std::size_t> large_;           ///< next()'s scratch
};

}  // namespace corolla::net
