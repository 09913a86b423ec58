// net/zmq_impl.hpp — the ZeroMQ transport's state: what callers and the I/O
// thread share about a connection, the I/O thread's view of one, and
// zmq_transport::impl, whose members live in zmq_transport.cpp (setup, the
// loop, the caller side), zmq_commands.cpp (running commands, opening and
// closing connections), zmq_receive.cpp (monitors, receiving, reassembly)
// and zmq_send.cpp (lanes, shaping, sending, the RDMA path).
// Internal: nothing outside net/ includes this header.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <zmq.h>

#include "net/fragment.hpp"
#include "net/log_limit.hpp"
#include "net/outbox.hpp"
#include "net/rdma_link.hpp"
#include "net/zmq_detail.hpp"
#include "net/zmq_transport.hpp"

namespace corolla::net {

namespace detail {

/// The clock of due times and shaping (steady_clock, as in net/shaping.hpp).
using clock_type = shaping_clock;

/// What callers and the I/O thread share about one connection.
struct conn_shared {
  std::atomic<bool> closed{false};  ///< send() refuses from now on
  /// Closed without a drain time: what send() accepted before and the I/O
  /// thread has not taken up yet is dropped (a drain close keeps it: the
  /// sends, and the connect, queued before the close still happen).
  std::atomic<bool> drop_queued{false};
  /// Incoming connection whose peer disconnected and has not sent since:
  /// ZeroMQ would refuse (EHOSTUNREACH) anything sent to it.
  std::atomic<bool> peer_gone{false};
  /// Messages accepted by send() and not yet handed to ZeroMQ.
  std::atomic<std::size_t> queued{0};
  /// Fragment payload bytes handed to ZeroMQ that it has not written to the
  /// kernel yet (decremented from ZeroMQ's thread as it releases them).
  std::atomic<std::size_t> bulk_in_zmq{0};
};

/// Owns a transmitted fragment's payload until ZeroMQ releases it, then
/// takes its bytes off the connection's bulk count and wakes the I/O thread
/// (which may now hand ZeroMQ the next fragment).
struct bulk_token {
  std::vector<std::shared_ptr<const void>> owners;  ///< the payload frames' owners, alive while ZeroMQ holds them
  std::shared_ptr<conn_shared> shared;  ///< the connection's shared state (bulk_in_zmq)
  std::size_t bytes = 0;  ///< payload bytes added to shared->bulk_in_zmq
  int wake_fd = -1;  ///< the I/O thread's eventfd, written once on release
  /// Runs when the last payload frame is released: on ZeroMQ's thread for
  /// frames it took without copying.
  ~bulk_token() {
    shared->bulk_in_zmq.fetch_sub(bytes);
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }
};

/// Work a caller pushes for the I/O thread (impl::push); the fields after
/// `shared` are the arguments of the op named in their comments.
struct command {
  /// What to do.
  enum class op : std::uint8_t { connect, send, set_profile, close, offer_rdma } what = op::send;
  connection_id conn = 0;  ///< the connection it is for
  std::shared_ptr<conn_shared> shared;  ///< that connection's shared state (a connect creates it)
  std::string endpoint, server_key;  ///< connect
  out_message message;                ///< send
  link_profile profile;              ///< set_profile
  std::chrono::milliseconds drain{0};  ///< close: how long queued messages may still take
};

/// One connection as the I/O thread sees it.
struct connection {
  connection_id id = 0;          ///< as callers know it (zmq_transport::connect, on_accept)
  bool outgoing = false;         ///< a DEALER we opened; false: a peer on our ROUTER
  void* socket = nullptr;        ///< DEALER
  void* monitor = nullptr;       ///< PAIR receiving the DEALER's monitor events
  std::string endpoint;          ///< outgoing: the peer's endpoint
  int suffix = 0;                ///< outgoing: routing-id suffix taken for `endpoint`
  std::string routing_id;        ///< incoming: the peer's routing id
  int peer_fd = -1;              ///< incoming: the TCP socket its last message came from
  bool established = false;      ///< up, and not reported down since
  bool blocked = false;          ///< ZeroMQ refused the head of `pending` (high-water mark)
  bool rdma_blocked = false;     ///< the RDMA path refused the head of `pending` (backlog full)
  bool delivered = false;        ///< a message (not RDMA control) came from the peer: its hello
  bool listed = false;           ///< in impl::with_pending_
  /// Closing gracefully (impl::closing_): closes once `pending` is empty or
  /// at this time, whichever comes first.
  std::optional<clock_type::time_point> close_at;
  link_shaper shaper;  ///< shapes what goes on the emulated link (set_link)
  bool shaped = false;  ///< the profile shapes: due times come from `shaper`
  /// Messages not yet on the (emulated) link, in lanes (net/outbox.hpp).
  outbox out;
  /// On the link: FIFO of units (whole messages, fragments) waiting for their
  /// shaped delivery time or for ZeroMQ to take them.
  std::deque<out_message> pending;
  std::size_t pending_fragments = 0;  ///< fragments in `pending`
  std::size_t max_pending_fragments = 2;  ///< shaped: how many may wait there (set_link)
  /// Fragment payload bytes sent that the peer has not credited yet, and
  /// how many may be (set_link).
  std::size_t unacked_fragment_bytes = 0;
  std::size_t credit_window = 0;  ///< how many may be uncredited (at least min_credit_window)
  reassembler in;                     ///< fragmented messages arriving
  std::shared_ptr<conn_shared> shared;  ///< what callers share about it (registry_)
  log_limiter bad_log;  ///< "dropped a bad message" and "message lost" lines from this connection
  /// The RDMA path (created by an offer either way); null until then.
  std::unique_ptr<rdma::link> rdma;
};

/// Which transport's I/O thread the current thread is (for the wake-up
/// shortcut when handlers send from inside a callback).
inline thread_local const void* current_io_owner = nullptr;

/// A ROUTER peer whose pipe is full has no per-peer POLLOUT: retry this often.
inline constexpr auto router_retry = std::chrono::microseconds(500);
/// Messages received from one socket per loop turn, so no socket starves.
inline constexpr int receive_batch = 64;
/// RDMA queue pairs one transport sets up at most (each pins 8 MiB).
inline constexpr std::size_t max_queue_pairs = 256;
/// On a shaped connection, fragments are put on the emulated link this far
/// ahead of the time it frees up: a small message sent meanwhile waits at
/// most this plus one fragment's transmission time.
inline constexpr auto shaping_lookahead = std::chrono::milliseconds(2);
/// How late the I/O thread may wake for the next fragment without leaving
/// a gap on a shaped link (and the largest burst after an idle wait).
inline constexpr auto wake_slack = std::chrono::milliseconds(20);
/// On a shaped link, fragments are sized to take about this long on it
/// (within [min_fragment_bytes, transport_options::fragment_bytes]).
inline constexpr auto fragment_airtime = std::chrono::microseconds(8500);
/// The smallest fragment a shaped link's airtime sizing makes (unless
/// transport_options::fragment_bytes is smaller).
inline constexpr std::size_t min_fragment_bytes = 64 * 1024;
/// Fragment payload a sender may have uncredited on an unshaped link:
/// enough for 320 MB/s at 50 ms round trips, and at most about 16 ms of
/// queue in front of a small message at a receiver taking in 1 GB/s.
inline constexpr std::size_t min_credit_window = std::size_t{16} << 20;

}  // namespace detail

// The transport's translation units (and only they) name these unqualified.
using detail::bulk_token;
using detail::clock_type;
using detail::command;
using detail::conn_shared;
using detail::connection;
using detail::current_io_owner;
using detail::fragment_airtime;
using detail::min_credit_window;
using detail::min_fragment_bytes;
using detail::max_queue_pairs;
using detail::receive_batch;
using detail::router_retry;
using detail::shaping_lookahead;
using detail::wake_slack;
using detail::zmq_error_text;

/// The transport's state and steps. The functions under "any thread" may be
/// called from any thread (they use queue_mu_, registry_mu_ and atomics);
/// those under "I/O thread only", and what only they touch, are that thread's.
struct zmq_transport::impl {
  /// Keeps the options and handlers; nothing is opened before open().
  impl(transport_options o, transport_events e) : opts_(std::move(o)), events_(std::move(e)) {}
  /// Stops the I/O thread (stopping_, then a wake-up) and joins it, then
  /// terminates the context and closes the eventfd and timerfd.
  ~impl();

  /// Checks the options: "" when usable, else what is wrong (identity,
  /// sizes, high-water marks, busy_poll_us, fragment_bytes, CurveZMQ keys).
  std::string validate() const;
  std::string open();  ///< creates the context, eventfd and timerfd
  /// The I/O thread: setup(), then `ready` gets "" or setup's error; on
  /// success loop() until stop, then teardown().
  void run(std::promise<std::string>& ready);

  // ---- any thread ----
  /// Registers a new connection id and queues its connect. Throws
  /// std::invalid_argument under CurveZMQ for a missing or malformed server key.
  connection_id connect(const std::string& endpoint, const std::string& server_key);
  /// Encodes `m` on the caller's thread and queues it; false for a connection
  /// that is unknown, closed or whose peer is gone, or that has queue_limit_
  /// queued. Throws what encode() throws.
  bool send(connection_id conn, const message& m);
  /// Queues a shaping change; ignored for a connection that is not registered.
  void set_profile(connection_id conn, const link_profile& p);
  /// Marks `conn` closed (without drain time: its queue dropped), forgets it
  /// for callers and queues the close; ignored for an unknown id.
  void close(connection_id conn, std::chrono::milliseconds drain);
  /// Queues an RDMA offer; ignored for a connection that is not registered.
  void offer_rdma(connection_id conn);
  /// Fills `c` for an open connection; false if `conn` is unknown or closed.
  bool command_for(connection_id conn, command::op what, command& c);
  /// Appends `c` to the queue; wakes the I/O thread when the queue was empty
  /// and the caller is not that thread.
  void push(command&& c);
  /// The shared state of a registered connection, or null.
  std::shared_ptr<conn_shared> shared_of(connection_id conn);

  transport_options opts_;  ///< as given to start()
  transport_events events_;  ///< called on the I/O thread, through notify()
  void* ctx_ = nullptr;  ///< the ZeroMQ context (open())
  int wake_fd_ = -1, timer_fd_ = -1;  ///< eventfd waking the I/O thread; timerfd for due times
  std::thread io_;  ///< the I/O thread
  std::atomic<bool> stopping_{false};  ///< set by ~impl: the loop ends once nothing is draining
  std::string endpoint_;  ///< written before start() returns, then constant
  std::size_t queue_limit_ = 1000;  ///< per connection, before send() refuses (send_hwm; 0: none)

  std::mutex queue_mu_;  ///< guards queue_
  std::vector<command> queue_;  ///< pushed, not yet run (run_commands)
  std::mutex registry_mu_;  ///< guards registry_
  std::unordered_map<connection_id, std::shared_ptr<conn_shared>> registry_;  ///< what callers may use, by id
  std::atomic<connection_id> next_id_{1};  ///< the next connection id (never reused)

  /// The totals zmq_transport::stats() reports.
  std::atomic<std::uint64_t> messages_sent_{0}, messages_received_{0}, bytes_sent_{0}, bytes_received_{0},
      bad_messages_{0}, rdma_messages_sent_{0}, rdma_messages_received_{0}, fragments_sent_{0},
      fragments_received_{0};
  /// Fragment payload bytes ZeroMQ may hold for one connection at once.
  std::size_t bulk_window_ = 0;

  // ---- I/O thread only ----
  /// Creates the ZAP handler (CurveZMQ) and, unless connect-only, the ROUTER
  /// with its monitor, bound to opts_.listen (endpoint_); "" or the error.
  std::string setup();
  /// Closes every socket, marks every connection closed, drops the ZAP handler.
  void teardown();
  /// Polls and serves the wake-up, timer, sockets, monitors, ZAP and RDMA
  /// descriptors, runs commands and sends, until stop_now().
  void loop();
  /// Rebuilds items_ and item_conn_: the fixed items, each DEALER's socket and
  /// monitor, then the RDMA links' descriptors.
  void rebuild_poll_items();
  /// Handles the ROUTER monitor's pending events: an incoming peer's
  /// disconnect (mark_down) and refused handshakes (on_auth_failure for auth).
  void drain_router_monitor();
  /// Handles `c`'s monitor events: handshake done (on_connect, once until it
  /// drops), disconnect (mark_down), failed handshakes (on_auth_failure for auth).
  void drain_dealer_monitor(connection& c);
  /// Receives up to receive_batch messages from `socket` (the ROUTER when
  /// `dealer` is null): credits, fragments, RDMA control, then on_message;
  /// bad messages are counted, logged (rate-limited) and reported.
  void receive_from(void* socket, connection* dealer);
  /// The incoming connection of `routing_id`, created (on_accept) if new; a
  /// known one that was down is up again (on_connect). Tracks its TCP fd.
  connection* incoming_for(const std::string& routing_id, int fd);
  /// Runs the queued commands, and those handlers push meanwhile (16 rounds at most).
  void run_commands();
  /// Opens the DEALER of a connect (routing id, CurveZMQ keys, monitor); on
  /// failure logs it, closes the connection and reports on_disconnect.
  void open_dealer(command& c);
  /// Closes `id` now: its DEALER (ZeroMQ may write what it holds for
  /// `linger`) or its routing id, its queue and RDMA link; forgets it.
  void close_connection(connection_id id, std::chrono::milliseconds linger = std::chrono::milliseconds{0});
  /// close() with a drain time: at once when nothing waits in `pending`,
  /// else once it has gone out or the time is up (finish_closing).
  void close_when_drained(connection_id id, std::chrono::milliseconds drain, clock_type::time_point now);
  /// Closes the draining connections whose queue is empty or whose time is up.
  void finish_closing(clock_type::time_point now);
  /// Whether the loop ends: stop() was asked for and no connection is still
  /// draining (they get their drain time first).
  bool stop_now();
  /// Sets the shaping of `c` (and the fragment size that suits it).
  void set_link(connection& c, const link_profile& p);
  /// Puts `m` in `c`'s outbox and sends what may go (only onto `pending`
  /// while ZeroMQ or the RDMA path is blocked); lists `c` while anything waits.
  void enqueue(connection& c, out_message&& m, clock_type::time_point now);
  /// Moves what may go now from the connection's outbox onto its link
  /// (`pending`), shaping each unit: every small message that may go, and
  /// fragments while the link has room for them.
  void pump(connection& c, clock_type::time_point now);
  /// Pumps, then transmits the units of `pending` that are due, until one is
  /// refused (blocked, rdma_blocked) or a ROUTER peer is gone (peer_gone).
  void flush(connection& c, clock_type::time_point now);
  /// Messages send() accepted for `c` that have not reached ZeroMQ yet.
  static std::size_t queued_count(const connection& c);
  /// Drops everything waiting for `c` (a peer gone, a close without drain).
  void drop_queued(connection& c);
  /// Sends one unit over the RDMA path (when it is sending and the unit is not
  /// tcp_only) or ZeroMQ. 0 once sent (or lost part-way, logged); else the
  /// first frame's error: EAGAIN (high-water mark), EHOSTUNREACH (ROUTER peer
  /// gone), EBUSY (RDMA backlog full), EINTR (flush() tries again later), or
  /// another error for which flush() drops the message and logs it.
  int transmit(connection& c, const out_message& m);
  /// An incoming connection's peer is unreachable: drops what waits for `c`,
  /// marks its peer gone (send() refuses) and reports it down.
  void peer_gone(connection& c, const char* why);
  /// `c`'s TCP connection dropped: clears half-received messages, drops
  /// half-sent large ones, resets the RDMA link; on_disconnect if it was up.
  void mark_down(connection& c);
  /// Arms the timerfd at the earliest due unit, shaped fragment, ROUTER retry
  /// or drain deadline (left alone when that is timer_at_ already).
  void arm_timer(clock_type::time_point now);
  /// Lists `c` in with_pending_ (once).
  void add_pending(connection& c);
  /// Makes `id` known to callers (registry_).
  void register_shared(connection_id id, std::shared_ptr<conn_shared> s);
  /// Forgets `id` for callers: send() refuses it, the other calls ignore it.
  void unregister_shared(connection_id id);
  /// Options every socket gets: linger 0, the high-water marks, the largest
  /// frame, TCP keepalive.
  void apply_common_options(void* socket) const;
  /// Whether DEALERs present the node's identity as their routing id (not
  /// under CurveZMQ: see open_dealer).
  bool presents_identity() const { return !opts_.identity.empty() && !opts_.curve.enabled; }
  /// Monitors `socket` on inproc://corolla-monitor-<name> and connects a PAIR
  /// to it (`monitor`); "" or the error. Call before it binds or connects.
  std::string attach_monitor(void* socket, const std::string& name, void*& monitor);
  /// Closes the socket; ZeroMQ may still send what it holds for
  /// `linger` (0: dropped at once).
  void close_socket(void*& socket, void*& monitor, std::chrono::milliseconds linger = std::chrono::milliseconds{0});
  /// `c`'s RDMA link, created on first use with hooks into this transport
  /// (and listed in with_rdma_).
  rdma::link& rdma_of(connection& c);
  /// Drives every RDMA link (completions, sends, deliveries) and counts the
  /// messages they sent.
  void rdma_progress();
  /// After `c`'s RDMA link ran: reports a lost path, and sends what waited
  /// for it once its backlog has room or the path is gone.
  void after_rdma(connection& c);
  /// Queues an RDMA control message on the connection's ZeroMQ path, in
  /// order with what is already queued there.
  void send_over_zmq(connection& c, const message& m);
  /// Credits the peer with `bytes` of fragment payload taken in.
  void send_credit(connection& c, std::uint64_t bytes);
  /// Reports a lost RDMA path as on_disconnect then on_connect (links say
  /// hello again), unless `c` is already down.
  void report_rdma_loss(connection& c);

  /// Calls `handler` (if set) with `args`; what it throws is logged, not passed on.
  template <class F, class... Args>
  void notify(const F& handler, const char* name, Args&&... args) {
    if (!handler) return;
    try {
      handler(std::forward<Args>(args)...);
    } catch (const std::exception& e) {
      spdlog::error("zmq transport: {} handler threw: {}", name, e.what());
    } catch (...) {
      spdlog::error("zmq transport: {} handler threw", name);
    }
  }

  void* router_ = nullptr;  ///< the listening ROUTER (null: connect-only)
  void* router_monitor_ = nullptr;  ///< PAIR receiving the ROUTER's monitor events
  std::unique_ptr<detail::zap_handler> zap_;  ///< CurveZMQ's ZAP handler (null without CurveZMQ)
  std::unordered_map<connection_id, std::unique_ptr<connection>> conns_;  ///< every open connection, by id
  std::unordered_map<std::string, connection_id> by_routing_id_;  ///< incoming connections by routing id
  std::unordered_map<int, connection_id> by_fd_;  ///< incoming connections by the fd of their current TCP connection
  std::map<std::string, std::set<int>> suffixes_;  ///< endpoint -> routing-id suffixes in use
  std::vector<connection*> with_pending_;  ///< with something in `out` or `pending` (connection::listed)
  std::vector<connection_id> closing_;  ///< closing gracefully (connection::close_at)
  std::vector<zmq_pollitem_t> items_;  ///< what zmq_poll watches (rebuild_poll_items)
  std::vector<connection*> item_conn_;  ///< parallel to items_; nullptr for fixed items
  std::size_t fixed_items_ = 0;  ///< the fixed items first: wake-up, timer, ROUTER, its monitor, ZAP
  std::size_t pair_items_end_ = 0;  ///< DEALER socket/monitor pairs end here; RDMA descriptors follow
  std::set<connection_id> with_rdma_;  ///< connections that have an RDMA link
  std::vector<connection_id> rdma_ids_;  ///< rdma_progress's copy of with_rdma_
  bool items_dirty_ = true;  ///< items_ must be rebuilt before the next poll
  clock_type::time_point timer_at_ = clock_type::time_point::max();  ///< the timerfd's setting (max: disarmed)
  std::chrono::microseconds busy_poll_{0};  ///< from opts_.busy_poll_us
  /// When the last loop turn that was not an empty spin ran (busy polling
  /// counts from it).
  clock_type::time_point last_activity_{};
};

}  // namespace corolla::net
