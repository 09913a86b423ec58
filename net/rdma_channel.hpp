// net/rdma_channel.hpp — corolla messages over one RC queue pair.
//
// Every message is first encoded into the same frames ZeroMQ would carry
// (net/codec.hpp: envelope, then one frame per tensor). Then:
//   * eager: when the header, a size table and every frame fit one 64 KiB
//     receive slot, they are copied into a registered send slot and go as
//     one SEND;
//   * rendezvous: otherwise the SEND carries, per frame, its size, address
//     and rkey; the frames' own memory (the tensors' storage, never copied)
//     stays registered until the receiver has pulled it with RDMA READs
//     (8 MiB each) into 64-byte aligned buffers, which the decoded tensors
//     adopt; the receiver then sends FIN and the sender releases the frames.
// Both sides post 64 receive slots. A sender spends a credit per SEND and
// gets them back in the `credits` field of the peer's SENDs (or in a bare
// credit message once half the slots were re-posted); data and FIN keep one
// credit in reserve for credit messages, so two busy sides cannot lock each
// other out and a receive is always posted when a SEND lands (no RNR).
// Messages are delivered in the order they were sent, rendezvous or not.
// Received headers are validated as the ZeroMQ path validates frames (the
// decoder's limits), and a bad one is reported and dropped.
//
// Not thread-safe: a channel belongs to the transport's I/O thread. The wire
// format is in docs/protocol.md ("RDMA transport").
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "net/codec.hpp"
#include "net/log_limit.hpp"
#include "net/message.hpp"
#include "net/rdma_verbs.hpp"

namespace corolla::net::rdma {

/// Protocol constants both ends use.
/// Receives each side keeps posted: a sender starts with this many credits.
inline constexpr int recv_slots = 64;
/// Bytes of one receive or send slot: the largest eager SEND (header, size
/// table and frames).
inline constexpr std::uint32_t slot_bytes = 64 * 1024;
/// Registered send slots: SENDs (eager, rendezvous, FIN, credit) in flight at once.
inline constexpr int send_slots = 64;
/// Work requests in flight on the send queue (SENDs and READs).
inline constexpr int max_outstanding = 192;
/// The largest READ a receiver posts: rendezvous frames are pulled in pieces of this.
inline constexpr std::uint32_t read_chunk_bytes = 8u << 20;

/// Corolla messages over one RC queue pair (the protocol in the file
/// comment). Owns the queue pair, its slots and what it has registered.
class channel {
 public:
  /// Totals so far: messages sent and received and their bytes, eager and
  /// rendezvous sends, received messages refused (bad_messages), and
  /// messages dropped unsent because their frame table does not fit a slot.
  struct counters {
    std::uint64_t messages_sent = 0, messages_received = 0, eager_sent = 0, rendezvous_sent = 0,
                  bytes_sent = 0, bytes_received = 0, bad_messages = 0, dropped = 0;
  };

  /// Registers and posts the receive slots. Throws std::runtime_error from
  /// the device.
  channel(std::unique_ptr<queue_pair> qp, decode_limits limits, bool send_checksums);
  /// Destroys the queue pair first, which takes every registration with it.
  ~channel();
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  /// This side's queue pair address, for the peer.
  qp_address local_address() const { return qp_->local_address(); }
  /// Connects the queue pair to the peer's address. Throws.
  void connect(const qp_address& remote);

  /// Encodes `m` and queues it (sent as credits allow, by progress()).
  /// Throws what encode() throws (a tensor that cannot travel).
  void send(const message& m);
  /// Queues frames encode() made (the ZeroMQ path's encoded form).
  void send_frames(std::vector<out_frame> frames);

  /// Handles every completion waiting, posts what credits and queue depth
  /// allow, and hands each message received, in order, to `on_message`
  /// (frames that failed validation to `on_bad` with the reason). Returns
  /// false once the channel has failed (see failure()): a failed work
  /// request leaves the queue pair in the error state.
  bool progress(const std::function<void(message&&)>& on_message,
                const std::function<void(const std::string&)>& on_bad);

  /// The queue pair's completion descriptor, to poll (readable once armed).
  int event_fd() const { return qp_->event_fd(); }
  /// Re-arms the event descriptor; call progress() after it.
  void arm() { qp_->arm(); }

  /// Whether the channel failed: a work request failed, a post or a
  /// registration threw in progress(), or a completion matched nothing.
  bool failed() const { return !failure_.empty(); }
  /// Why it failed (the first failure); "" while it works.
  const std::string& failure() const { return failure_; }
  /// Nothing queued, in flight or held for ordering.
  bool idle() const;
  /// Messages accepted by send() and not yet handed to the queue pair.
  std::size_t queued() const { return out_.size(); }
  /// Bytes of rendezvous messages the peer has not finished reading (their
  /// memory stays registered and alive until its FIN).
  std::uint64_t rendezvous_bytes_out() const;
  /// The counters so far.
  counters stats() const { return stats_; }

 private:
  struct buffer_deleter {
    void operator()(std::uint8_t* p) const;
  };
  struct out_message {
    std::vector<out_frame> frames;
    std::vector<memory_keys> keys;  // rendezvous: the frames' registrations
    std::uint64_t bytes = 0;
  };
  struct incoming {
    std::uint64_t seq = 0;
    bool ready = false;
    std::optional<message> msg;
    std::string bad;  // set when the message was refused
    // rendezvous
    std::uint64_t rendezvous_id = 0;
    std::vector<std::shared_ptr<std::uint8_t>> buffers;
    std::vector<std::size_t> sizes;
    std::vector<memory_keys> keys;
    std::uint64_t bytes = 0;
    int reads_left = 0;
    std::vector<std::uint8_t> table;  // the frame table until the READs are posted
  };
  using aligned_buffer = std::unique_ptr<std::uint8_t[], buffer_deleter>;
  static aligned_buffer allocate(std::size_t size);

  void fail(const std::string& why);
  void handle(const completion& c);
  /// Parses receive slot `slot`; bad messages are queued in order and
  /// reported by deliver().
  void on_receive(int slot, std::uint32_t bytes);
  /// Posts the READs of `in`, or (may_wait) queues it behind earlier ones
  /// when the read budget is spent.
  void start_rendezvous(incoming& in, bool may_wait);
  void finish_rendezvous(incoming& in);
  /// Marks `in` ready with the decoded message (counting `bytes`) or the
  /// reason it was refused.
  void settle(incoming& in, caf::expected<message> decoded, std::uint64_t bytes);
  void pump();
  bool post_header(const std::vector<std::uint8_t>& header, const std::vector<out_frame>* eager_frames);
  void deliver(const std::function<void(message&&)>& on_message,
               const std::function<void(const std::string&)>& on_bad);

  decode_limits limits_;
  bool send_checksums_;
  std::string failure_;
  counters stats_;
  log_limiter peer_log_;  // warnings caused by what the peer sends

  // Registered memory: receive slots, send slots.
  aligned_buffer recv_area_, send_area_;
  memory_keys recv_keys_{}, send_keys_{};
  std::vector<int> free_send_slots_;

  int peer_credits_ = recv_slots;  // receives the peer has posted for us
  int credits_to_return_ = 0;      // our re-posted slots the peer does not know of
  int outstanding_ = 0;            // work requests on the send queue

  std::deque<out_message> out_;           // data messages in send order
  std::deque<std::uint64_t> fins_;        // FINs to send
  std::map<std::uint64_t, out_message> rendezvous_out_;  // id -> frames the peer is reading
  std::uint64_t next_rendezvous_id_ = 1;

  std::deque<incoming> in_;               // received, in order, until delivered
  std::uint64_t next_in_seq_ = 0, first_in_seq_ = 0;
  struct read_chunk {
    std::uint64_t in_seq;
    void* local;
    std::uint32_t size, lkey, rkey;
    std::uint64_t remote;
  };
  std::deque<read_chunk> reads_to_post_;
  std::uint64_t incoming_bytes_ = 0;      // rendezvous bytes being read
  std::deque<std::uint64_t> deferred_;    // rendezvous waiting for the read budget (sequence numbers)

  // Declared last: destroyed first, while the memory it registered lives.
  std::unique_ptr<queue_pair> qp_;
};

}  // namespace corolla::net::rdma
