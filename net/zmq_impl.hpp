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
  std::vector<std::shared_ptr<const void>> owners;
  std::shared_ptr<conn_shared> shared;
  std::size_t bytes = 0;
  int wake_fd = -1;
  ~bulk_token() {
    shared->bulk_in_zmq.fetch_sub(bytes);
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }
};

struct command {
  enum class op : std::uint8_t { connect, send, set_profile, close, offer_rdma } what = op::send;
  connection_id conn = 0;
  std::shared_ptr<conn_shared> shared;
  std::string endpoint, server_key;  // connect
  out_message message;                // send
  link_profile profile;              // set_profile
  std::chrono::milliseconds drain{0};  // close: how long queued messages may still take
};

/// One connection as the I/O thread sees it.
struct connection {
  connection_id id = 0;
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
  link_shaper shaper;
  bool shaped = false;
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
  std::size_t credit_window = 0;
  reassembler in;                     ///< fragmented messages arriving
  std::shared_ptr<conn_shared> shared;
  log_limiter bad_log;  ///< "dropped a bad message" lines from this connection
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

struct zmq_transport::impl {
  impl(transport_options o, transport_events e) : opts_(std::move(o)), events_(std::move(e)) {}
  ~impl();

  std::string validate() const;
  std::string open();  ///< creates the context, eventfd and timerfd
  void run(std::promise<std::string>& ready);

  // ---- any thread ----
  connection_id connect(const std::string& endpoint, const std::string& server_key);
  bool send(connection_id conn, const message& m);
  void set_profile(connection_id conn, const link_profile& p);
  void close(connection_id conn, std::chrono::milliseconds drain);
  void offer_rdma(connection_id conn);
  /// Fills `c` for an open connection; false if `conn` is unknown or closed.
  bool command_for(connection_id conn, command::op what, command& c);
  void push(command&& c);
  std::shared_ptr<conn_shared> shared_of(connection_id conn);

  transport_options opts_;
  transport_events events_;
  void* ctx_ = nullptr;
  int wake_fd_ = -1, timer_fd_ = -1;
  std::thread io_;
  std::atomic<bool> stopping_{false};
  std::string endpoint_;  // written before start() returns, then constant
  std::size_t queue_limit_ = 1000;

  std::mutex queue_mu_;
  std::vector<command> queue_;
  std::mutex registry_mu_;
  std::unordered_map<connection_id, std::shared_ptr<conn_shared>> registry_;
  std::atomic<connection_id> next_id_{1};

  std::atomic<std::uint64_t> messages_sent_{0}, messages_received_{0}, bytes_sent_{0}, bytes_received_{0},
      bad_messages_{0}, rdma_messages_sent_{0}, rdma_messages_received_{0}, fragments_sent_{0},
      fragments_received_{0};
  /// Fragment payload bytes ZeroMQ may hold for one connection at once.
  std::size_t bulk_window_ = 0;

  // ---- I/O thread only ----
  std::string setup();
  void teardown();
  void loop();
  void rebuild_poll_items();
  void drain_router_monitor();
  void drain_dealer_monitor(connection& c);
  void receive_from(void* socket, connection* dealer);
  connection* incoming_for(const std::string& routing_id, int fd);
  void run_commands();
  void open_dealer(command& c);
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
  void enqueue(connection& c, out_message&& m, clock_type::time_point now);
  /// Moves what may go now from the connection's outbox onto its link
  /// (`pending`), shaping each unit: every small message that may go, and
  /// fragments while the link has room for them.
  void pump(connection& c, clock_type::time_point now);
  void flush(connection& c, clock_type::time_point now);
  /// Messages send() accepted for `c` that have not reached ZeroMQ yet.
  static std::size_t queued_count(const connection& c);
  /// Drops everything waiting for `c` (a peer gone, a close without drain).
  void drop_queued(connection& c);
  int transmit(connection& c, const out_message& m);
  void peer_gone(connection& c, const char* why);
  void mark_down(connection& c);
  void arm_timer(clock_type::time_point now);
  void add_pending(connection& c);
  void register_shared(connection_id id, std::shared_ptr<conn_shared> s);
  void unregister_shared(connection_id id);
  void apply_common_options(void* socket) const;
  /// Whether DEALERs present the node's identity as their routing id (not
  /// under CurveZMQ: see open_dealer).
  bool presents_identity() const { return !opts_.identity.empty() && !opts_.curve.enabled; }
  std::string attach_monitor(void* socket, const std::string& name, void*& monitor);
  /// Closes the socket; ZeroMQ may still send what it holds for
  /// `linger` (0: dropped at once).
  void close_socket(void*& socket, void*& monitor, std::chrono::milliseconds linger = std::chrono::milliseconds{0});
  rdma::link& rdma_of(connection& c);
  void rdma_progress();
  void after_rdma(connection& c);
  /// Queues an RDMA control message on the connection's ZeroMQ path, in
  /// order with what is already queued there.
  void send_over_zmq(connection& c, const message& m);
  /// Credits the peer with `bytes` of fragment payload taken in.
  void send_credit(connection& c, std::uint64_t bytes);
  void report_rdma_loss(connection& c);

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

  void* router_ = nullptr;
  void* router_monitor_ = nullptr;
  std::unique_ptr<detail::zap_handler> zap_;
  std::unordered_map<connection_id, std::unique_ptr<connection>> conns_;
  std::unordered_map<std::string, connection_id> by_routing_id_;
  std::unordered_map<int, connection_id> by_fd_;
  std::map<std::string, std::set<int>> suffixes_;  // endpoint -> routing-id suffixes in use
  std::vector<connection*> with_pending_;
  std::vector<connection_id> closing_;  ///< closing gracefully (connection::close_at)
  std::vector<zmq_pollitem_t> items_;
  std::vector<connection*> item_conn_;  // parallel to items_; nullptr for fixed items
  std::size_t fixed_items_ = 0;
  std::size_t pair_items_end_ = 0;  // DEALER socket/monitor pairs end here; RDMA descriptors follow
  std::set<connection_id> with_rdma_;  // connections that have an RDMA link
  std::vector<connection_id> rdma_ids_;  // rdma_progress's copy of with_rdma_
  bool items_dirty_ = true;
  clock_type::time_point timer_at_ = clock_type::time_point::max();
  std::chrono::microseconds busy_poll_{0};  // from opts_.busy_poll_us
  clock_type::time_point last_activity_{};
};

}  // namespace corolla::net
