// net/zmq_transport.cpp — the ZeroMQ transport: one I/O thread owns the
// context's sockets and serves a command queue, the sockets, their monitors,
// the ZAP handler and the shaping timer from one zmq_poll loop.
//
// Threads: callers encode on their own thread and push commands under
// queue_mu_, waking the I/O thread through an eventfd (only when the queue
// was empty: one write per burst). Everything below "I/O thread only" is
// touched by that thread alone; callers see connections through registry_
// (id -> shared flags and queue depth), which lets send() refuse a closed
// connection or a full queue synchronously.
//
// Timing: shaped messages wait in their connection's FIFO until their due
// time; a timerfd armed at the earliest due time (absolute CLOCK_MONOTONIC,
// which is what steady_clock reads) wakes zmq_poll with microsecond
// precision, where zmq_poll's own timeout only has milliseconds.
#include "net/zmq_transport.hpp"

#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <caf/sec.hpp>
#include <spdlog/spdlog.h>
#include <zmq.h>

#include "net/fragment.hpp"
#include "net/log_limit.hpp"
#include "net/outbox.hpp"
#include "net/rdma_link.hpp"
#include "net/zmq_detail.hpp"

namespace corolla::net {

namespace {

using clock_type = shaping_clock;
using detail::zmq_error_text;

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
  reassembler in;                     ///< fragmented messages arriving
  std::shared_ptr<conn_shared> shared;
  log_limiter bad_log;  ///< "dropped a bad message" lines from this connection
  /// The RDMA path (created by an offer either way); null until then.
  std::unique_ptr<rdma::link> rdma;
};

/// Which transport's I/O thread the current thread is (for the wake-up
/// shortcut when handlers send from inside a callback).
thread_local const void* current_io_owner = nullptr;

/// A ROUTER peer whose pipe is full has no per-peer POLLOUT: retry this often.
constexpr auto router_retry = std::chrono::microseconds(500);
/// Messages received from one socket per loop turn, so no socket starves.
constexpr int receive_batch = 64;
/// RDMA queue pairs one transport sets up at most (each pins 8 MiB).
constexpr std::size_t max_queue_pairs = 256;
/// On a shaped connection, fragments are put on the emulated link this far
/// ahead of the time it frees up: a small message sent meanwhile waits at
/// most this plus one fragment's transmission time.
constexpr auto shaping_lookahead = std::chrono::milliseconds(2);

}  // namespace

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

// ---- construction and teardown ------------------------------------------------

std::string zmq_transport::impl::validate() const {
  if (opts_.identity.size() > 200) return "transport identity is longer than 200 bytes";
  if (!opts_.identity.empty() && opts_.identity[0] == '\0')
    return "transport identity must not start with a zero byte (ZeroMQ reserves those routing ids)";
  if (opts_.max_frame_bytes <= 0) return "max_frame_bytes must be positive";
  if (opts_.send_hwm < 0 || opts_.recv_hwm < 0) return "high-water marks must not be negative";
  if (opts_.busy_poll_us < 0 || opts_.busy_poll_us > 1000000)
    return "busy_poll_us must be between 0 and 1000000 (one second)";
  if (opts_.fragment_bytes != 0 && opts_.fragment_bytes < 4096)
    return "fragment_bytes must be 0 (never fragment) or at least 4096";
  const auto& c = opts_.curve;
  if (!c.enabled) return {};
  if (!zmq_has("curve")) return "CurveZMQ requested but this libzmq was built without CURVE support";
  if (!detail::is_z85_key(c.public_key)) return "CurveZMQ public key is not 40 Z85 characters";
  if (!detail::is_z85_key(c.secret_key)) return "CurveZMQ secret key is not 40 Z85 characters";
  char derived[41];
  if (zmq_curve_public(derived, c.secret_key.c_str()) != 0 || c.public_key != std::string(derived, 40))
    return "CurveZMQ public key does not belong to the secret key";
  for (const auto& k : c.allowed)
    if (!detail::is_z85_key(k)) return "allow-list entry \"" + k + "\" is not a 40-character Z85 public key";
  return {};
}

std::string zmq_transport::impl::open() {
  // send_hwm 0 means "no limit" to ZeroMQ, and so here.
  queue_limit_ = opts_.send_hwm > 0 ? static_cast<std::size_t>(opts_.send_hwm) : SIZE_MAX;
  busy_poll_ = std::chrono::microseconds(opts_.busy_poll_us);
  bulk_window_ = 2 * opts_.fragment_bytes;
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return std::string("eventfd: ") + std::strerror(errno);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0) return std::string("timerfd_create: ") + std::strerror(errno);
  ctx_ = zmq_ctx_new();
  if (!ctx_) return zmq_error_text("zmq_ctx_new");
  zmq_ctx_set(ctx_, ZMQ_BLOCKY, 0);  // sockets close with linger 0 anyway
  return {};
}

zmq_transport::impl::~impl() {
  if (io_.joinable()) {
    stopping_.store(true);
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    io_.join();
  }
  // Every socket was closed by the I/O thread, so this returns at once;
  // frames still in ZeroMQ's pipes release their owners here.
  if (ctx_) zmq_ctx_term(ctx_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (timer_fd_ >= 0) ::close(timer_fd_);
}

void zmq_transport::impl::apply_common_options(void* s) const {
  detail::set_int_option(s, ZMQ_LINGER, 0);
  detail::set_int_option(s, ZMQ_SNDHWM, opts_.send_hwm);
  detail::set_int_option(s, ZMQ_RCVHWM, opts_.recv_hwm);
  const std::int64_t max_size = opts_.max_frame_bytes;
  zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_size, sizeof max_size);
  detail::set_int_option(s, ZMQ_TCP_KEEPALIVE, 1);
  detail::set_int_option(s, ZMQ_TCP_KEEPALIVE_IDLE, 30);
  detail::set_int_option(s, ZMQ_TCP_KEEPALIVE_INTVL, 5);
  detail::set_int_option(s, ZMQ_TCP_KEEPALIVE_CNT, 3);
}

std::string zmq_transport::impl::attach_monitor(void* s, const std::string& name, void*& monitor) {
  // The monitor's PAIR must be connected before the socket binds or
  // connects: events sent while nobody listens are dropped.
  const std::string address = "inproc://corolla-monitor-" + name;
  if (zmq_socket_monitor(s, address.c_str(), ZMQ_EVENT_ALL) != 0) return zmq_error_text("zmq_socket_monitor");
  monitor = zmq_socket(ctx_, ZMQ_PAIR);
  if (!monitor) return zmq_error_text("monitor socket");
  detail::set_int_option(monitor, ZMQ_LINGER, 0);
  if (zmq_connect(monitor, address.c_str()) != 0) return zmq_error_text("connect " + address);
  return {};
}

void zmq_transport::impl::close_socket(void*& s, void*& monitor, std::chrono::milliseconds linger) {
  if (s && monitor) zmq_socket_monitor(s, nullptr, 0);
  if (monitor) zmq_close(monitor);
  if (s && linger.count() > 0) detail::set_int_option(s, ZMQ_LINGER, static_cast<int>(linger.count()));
  if (s) zmq_close(s);
  s = monitor = nullptr;
}

std::string zmq_transport::impl::setup() {
  if (opts_.curve.enabled) {
    zap_ = std::make_unique<detail::zap_handler>(
        opts_.curve.allowed, [this](const std::string& reason) {
          notify(events_.on_auth_failure, "on_auth_failure", connection_id{0}, reason);
        });
    if (auto err = zap_->bind(ctx_); !err.empty()) return err;
  }
  if (opts_.listen.empty()) return {};
  router_ = zmq_socket(ctx_, ZMQ_ROUTER);
  if (!router_) return zmq_error_text("ROUTER socket");
  apply_common_options(router_);
  // Sends to a peer that is gone fail (EHOSTUNREACH) instead of vanishing;
  // a restarted peer presenting the same routing id takes over its slot.
  detail::set_int_option(router_, ZMQ_ROUTER_MANDATORY, 1);
  detail::set_int_option(router_, ZMQ_ROUTER_HANDOVER, 1);
  if (opts_.curve.enabled) {
    detail::set_int_option(router_, ZMQ_CURVE_SERVER, 1);
    zmq_setsockopt(router_, ZMQ_CURVE_SECRETKEY, opts_.curve.secret_key.data(), 40);
    zmq_setsockopt(router_, ZMQ_ZAP_DOMAIN, "corolla", 7);
  }
  if (auto err = attach_monitor(router_, "router", router_monitor_); !err.empty()) return err;
  if (zmq_bind(router_, opts_.listen.c_str()) != 0) return zmq_error_text("cannot listen on " + opts_.listen);
  char bound[256];
  std::size_t len = sizeof bound;
  if (zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, bound, &len) != 0) return zmq_error_text("ZMQ_LAST_ENDPOINT");
  endpoint_.assign(bound, strnlen(bound, len));
  return {};
}

void zmq_transport::impl::teardown() {
  for (auto& [id, c] : conns_) close_socket(c->socket, c->monitor);
  for (auto& [id, c] : conns_) c->shared->closed.store(true);
  conns_.clear();
  with_pending_.clear();
  close_socket(router_, router_monitor_);
  zap_.reset();
}

void zmq_transport::impl::run(std::promise<std::string>& ready) {
  current_io_owner = this;
  std::string err = setup();
  if (!err.empty()) {
    teardown();
    ready.set_value(err);
    return;
  }
  ready.set_value({});  // `ready` lives on the starter's stack: not touched again
  loop();
  teardown();
}

// ---- the loop -------------------------------------------------------------------

void zmq_transport::impl::rebuild_poll_items() {
  items_.clear();
  item_conn_.clear();
  auto add = [&](void* socket, int fd, connection* c) {
    items_.push_back(zmq_pollitem_t{socket, fd, ZMQ_POLLIN, 0});
    item_conn_.push_back(c);
  };
  add(nullptr, wake_fd_, nullptr);
  add(nullptr, timer_fd_, nullptr);
  if (router_) {
    add(router_, 0, nullptr);
    add(router_monitor_, 0, nullptr);
  }
  if (zap_) add(zap_->socket(), 0, nullptr);
  fixed_items_ = items_.size();
  for (auto& [id, c] : conns_) {
    if (!c->outgoing || !c->socket) continue;
    add(c->socket, 0, c.get());
    add(c->monitor, 0, c.get());
  }
  pair_items_end_ = items_.size();
  for (connection_id id : with_rdma_) {
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second->rdma->event_fd() < 0) continue;
    add(nullptr, it->second->rdma->event_fd(), it->second.get());
  }
  items_dirty_ = false;
}

bool zmq_transport::impl::stop_now() {
  if (!stopping_.load(std::memory_order_relaxed)) return false;
  run_commands();  // a graceful close asked for just before the stop
  return closing_.empty();
}

void zmq_transport::impl::loop() {
  while (!stop_now()) {
    if (items_dirty_) rebuild_poll_items();
    // A DEALER whose high-water mark was reached waits for POLLOUT.
    for (std::size_t i = fixed_items_; i < pair_items_end_; i += 2)
      items_[i].events = static_cast<short>(ZMQ_POLLIN | (item_conn_[i]->blocked ? ZMQ_POLLOUT : 0));
    bool commands_waiting;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      commands_waiting = !queue_.empty();  // pushed by a handler on this thread
    }
    // Within busy_poll of the last activity the thread polls without
    // sleeping: a message or command arriving then is seen at once instead of
    // after a sleeping thread's wake-up (tens of microseconds across cores on
    // a virtual machine).
    const bool spinning = !commands_waiting && busy_poll_.count() > 0 &&
                          clock_type::now() - last_activity_ < busy_poll_;
    const int ready = zmq_poll(items_.data(), static_cast<int>(items_.size()),
                               commands_waiting || spinning ? 0 : -1);
    if (ready < 0) {
      if (zmq_errno() != EINTR) spdlog::error("zmq transport: {}", zmq_error_text("zmq_poll"));
      continue;
    }
    if (stop_now()) break;
    if (ready == 0 && spinning) {  // nothing yet: let other threads run, then poll again
      std::this_thread::yield();
      continue;
    }
    std::uint64_t count;
    if (items_[0].revents & ZMQ_POLLIN) {
      [[maybe_unused]] auto n = ::read(wake_fd_, &count, sizeof count);
    }
    if (items_[1].revents & ZMQ_POLLIN) {
      [[maybe_unused]] auto n = ::read(timer_fd_, &count, sizeof count);
      timer_at_ = clock_type::time_point::max();
    }
    std::size_t i = 2;
    if (router_) {
      // Monitor first: a disconnect must be attributed before a new peer
      // reuses the same file descriptor.
      if (items_[i + 1].revents & ZMQ_POLLIN) drain_router_monitor();
      if (items_[i].revents & ZMQ_POLLIN) receive_from(router_, nullptr);
      i += 2;
    }
    if (zap_) {
      if (items_[i].revents & ZMQ_POLLIN) zap_->serve_pending();
      ++i;
    }
    for (i = fixed_items_; i < pair_items_end_; i += 2) {
      connection* c = item_conn_[i];
      if (items_[i + 1].revents & ZMQ_POLLIN) drain_dealer_monitor(*c);
      if (items_[i].revents & ZMQ_POLLIN) receive_from(c->socket, c);
      if (items_[i].revents & ZMQ_POLLOUT) c->blocked = false;
    }
    // Completion descriptors: re-arm, then progress below polls the queues.
    // A handler above may have closed the connection (items_dirty_).
    for (i = pair_items_end_; i < items_.size() && !items_dirty_; ++i)
      if ((items_[i].revents & ZMQ_POLLIN) && item_conn_[i]->rdma) item_conn_[i]->rdma->arm();
    run_commands();
    const auto now = clock_type::now();
    last_activity_ = now;
    // flush() may drop a connection from the list; iterate over a copy.
    const auto listed = with_pending_;
    for (connection* c : listed)
      if ((!c->blocked || !c->outgoing) && !c->rdma_blocked) flush(*c, now);
    with_pending_.erase(std::remove_if(with_pending_.begin(), with_pending_.end(),
                                       [](connection* c) {
                                         if (!c->pending.empty() || !c->out.empty()) return false;
                                         c->listed = false;
                                         return true;
                                       }),
                        with_pending_.end());
    rdma_progress();
    finish_closing(now);
    arm_timer(now);
  }
}

void zmq_transport::impl::arm_timer(clock_type::time_point now) {
  auto next = clock_type::time_point::max();
  for (const connection_id id : closing_)
    if (auto it = conns_.find(id); it != conns_.end()) next = std::min(next, *it->second->close_at);
  for (connection* c : with_pending_) {
    // Fragments held back by shaping go on the link shortly before it frees
    // up (those held back by ZeroMQ's backlog: its release wakes us).
    if (c->shaped && !c->out.empty())
      next = std::min(next, std::max(now, c->shaper.link_free() - shaping_lookahead));
    if (c->pending.empty()) continue;
    if (c->blocked && c->outgoing) continue;  // POLLOUT wakes us
    if (c->rdma_blocked) continue;            // RDMA completions wake us
    next = std::min(next, c->blocked ? now + router_retry : c->pending.front().due);
  }
  if (next == timer_at_) return;
  itimerspec spec{};
  if (next != clock_type::time_point::max()) {
    // A due time already passed fires at once (an all-zero value would
    // disarm instead, hence at least 1 ns).
    const auto ns = std::max<std::int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count());
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  }
  if (::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0)
    spdlog::error("zmq transport: timerfd_settime: {}", std::strerror(errno));
  timer_at_ = next;
}

// ---- monitors -----------------------------------------------------------------

void zmq_transport::impl::drain_router_monitor() {
  while (auto e = detail::read_monitor_event(router_monitor_)) {
    spdlog::trace("zmq transport: ROUTER event {:#x} value {} ({})", e->event, e->value, e->endpoint);
    switch (e->event) {
      case ZMQ_EVENT_DISCONNECTED: {
        auto it = by_fd_.find(static_cast<int>(e->value));
        if (it == by_fd_.end()) break;  // a peer that never sent a whole message
        const connection_id id = it->second;
        by_fd_.erase(it);
        auto c = conns_.find(id);
        if (c == conns_.end()) break;
        c->second->peer_fd = -1;
        c->second->shared->peer_gone.store(true);
        spdlog::debug("zmq transport: incoming connection {} ({}) disconnected", id, c->second->routing_id);
        mark_down(*c->second);
        break;
      }
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        break;  // the ZAP handler has logged and reported the refused key
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
        const std::string reason = "a peer connecting to " + e->endpoint + " was refused: " +
                                   detail::describe_handshake_failure(*e);
        if (detail::is_auth_failure(*e)) {
          spdlog::warn("zmq transport: {}", reason);
          notify(events_.on_auth_failure, "on_auth_failure", connection_id{0}, reason);
        } else {
          spdlog::debug("zmq transport: {}", reason);
        }
        break;
      }
      default: break;
    }
  }
}

void zmq_transport::impl::drain_dealer_monitor(connection& c) {
  while (auto e = detail::read_monitor_event(c.monitor)) {
    switch (e->event) {
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        if (!c.established) {
          c.established = true;
          spdlog::debug("zmq transport: connection {} to {} is up", c.id, c.endpoint);
          notify(events_.on_connect, "on_connect", c.id);
        }
        break;
      case ZMQ_EVENT_DISCONNECTED:
        spdlog::debug("zmq transport: connection {} to {} dropped", c.id, c.endpoint);
        mark_down(c);
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
        const std::string reason = "connection " + std::to_string(c.id) + " to " + c.endpoint + ": " +
                                   detail::describe_handshake_failure(*e);
        if (detail::is_auth_failure(*e)) {
          spdlog::warn("zmq transport: {}", reason);
          notify(events_.on_auth_failure, "on_auth_failure", c.id, reason);
        } else {
          spdlog::debug("zmq transport: {}", reason);
        }
        break;
      }
      default: break;
    }
  }
}

void zmq_transport::impl::mark_down(connection& c) {
  // Half-received fragmented messages will not be completed; half-sent ones
  // cannot be (the peer dropped its part).
  c.in.clear();
  if (const std::size_t dropped = c.out.drop_started(); dropped > 0) {
    spdlog::debug("zmq transport: connection {} lost: {} partly sent large messages dropped", c.id, dropped);
    c.shared->queued.fetch_sub(dropped);
  }
  if (c.rdma) {
    c.rdma->reset();  // the peer may be gone; a new hello offers again
    items_dirty_ = true;
  }
  if (!c.established) return;
  c.established = false;
  notify(events_.on_disconnect, "on_disconnect", c.id);
}

// ---- receiving ------------------------------------------------------------------

connection* zmq_transport::impl::incoming_for(const std::string& routing_id, int fd) {
  auto known = by_routing_id_.find(routing_id);
  if (known == by_routing_id_.end()) {
    auto c = std::make_unique<connection>();
    c->id = next_id_.fetch_add(1);
    c->routing_id = routing_id;
    c->shaper = link_shaper(opts_.default_profile, opts_.shaping_seed + c->id);
    c->shaped = !opts_.default_profile.unshaped();
    c->out = outbox(opts_.fragment_bytes);
    c->in = reassembler(opts_.limits);
    c->shared = std::make_shared<conn_shared>();
    c->established = true;
    c->peer_fd = fd;
    if (fd >= 0) {
      if (by_fd_.count(fd)) drain_router_monitor();  // a reused descriptor: settle the old owner first
      by_fd_[fd] = c->id;
    }
    register_shared(c->id, c->shared);
    by_routing_id_[routing_id] = c->id;
    connection* raw = c.get();
    conns_[c->id] = std::move(c);
    spdlog::debug("zmq transport: incoming connection {} from routing id of {} bytes", raw->id, routing_id.size());
    notify(events_.on_accept, "on_accept", raw->id, routing_id);
    return raw;
  }
  connection& c = *conns_.at(known->second);
  if (fd >= 0 && fd != c.peer_fd) {
    // A new TCP connection behind this routing id (handover after a restart
    // or a reconnect), or a descriptor reused after another peer left:
    // report pending disconnects first so the order of events is right.
    drain_router_monitor();
    if (c.peer_fd >= 0) {
      auto old = by_fd_.find(c.peer_fd);
      if (old != by_fd_.end() && old->second == c.id) by_fd_.erase(old);
    }
    c.peer_fd = fd;
    by_fd_[fd] = c.id;
    c.in.clear();  // a new TCP connection does not continue a half-received message
  }
  if (!c.established) {
    c.established = true;
    c.shared->peer_gone.store(false);
    spdlog::debug("zmq transport: incoming connection {} is back", c.id);
    notify(events_.on_connect, "on_connect", c.id);
  }
  return &c;
}

void zmq_transport::impl::receive_from(void* socket, connection* dealer) {
  // Routing id (ROUTER only), envelope, at most max_tensors tensor frames,
  // plus one so that decode() can name an excess.
  const std::size_t max_parts = opts_.limits.max_tensors + 2 + (dealer ? 0 : 1);
  std::vector<std::shared_ptr<detail::received_part>> parts;
  std::vector<in_frame> frames;
  for (int n = 0; n < receive_batch; ++n) {
    parts.clear();
    auto first = std::make_shared<detail::received_part>();
    if (zmq_msg_recv(static_cast<zmq_msg_t*>(first->msg()), socket, ZMQ_DONTWAIT) < 0) {
      if (zmq_errno() != EAGAIN) spdlog::error("zmq transport: {}", zmq_error_text("receive"));
      return;
    }
    std::size_t bytes = first->size(), dropped_parts = 0;
    bool more = first->more();
    parts.push_back(std::move(first));
    while (more) {  // the rest of a multi-part message is already here
      auto part = std::make_shared<detail::received_part>();
      if (zmq_msg_recv(static_cast<zmq_msg_t*>(part->msg()), socket, 0) < 0) break;
      bytes += part->size();
      more = part->more();
      if (parts.size() < max_parts)
        parts.push_back(std::move(part));
      else
        ++dropped_parts;  // bounded memory for a message of a million frames
    }

    connection* c = dealer;
    std::size_t first_frame = 0;
    if (!dealer) {
      const std::string routing_id(static_cast<const char*>(parts[0]->data()), parts[0]->size());
      // The ROUTER makes the routing-id frame itself and leaves its source
      // descriptor unset (-1); the peer's own frames carry it.
      const int fd = parts.size() > 1 ? zmq_msg_get(static_cast<zmq_msg_t*>(parts[1]->msg()), ZMQ_SRCFD) : -1;
      spdlog::trace("zmq transport: message from fd {}", fd);
      c = incoming_for(routing_id, fd);
      bytes -= parts[0]->size();
      first_frame = 1;
    }
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    if (c->shared->closed.load()) continue;

    std::string reason;
    if (dropped_parts > 0) {
      reason = "message of " + std::to_string(parts.size() - first_frame + dropped_parts) +
               " frames exceeds the limit of " + std::to_string(opts_.limits.max_tensors) + " tensors";
    } else if (parts.size() <= first_frame) {
      reason = "message without frames";
    } else {
      frames.clear();
      for (std::size_t i = first_frame; i < parts.size(); ++i)
        frames.push_back(in_frame{parts[i]->data(), parts[i]->size(), parts[i]});
      bool whole = true;
      if (is_fragment_header(frames[0].data, frames[0].size)) {
        fragments_received_.fetch_add(1, std::memory_order_relaxed);
        auto done = c->in.add(std::span<const in_frame>(frames));
        if (!done) {
          reason = error_text(done.error());
          whole = false;
        } else if (!*done) {
          continue;  // more fragments of it to come
        } else {
          frames = std::move(**done);
        }
      }
      auto decoded = whole ? decode(std::span<const in_frame>(frames), opts_.limits)
                           : caf::expected<message>(caf::make_error(caf::sec::invalid_argument, reason));
      if (decoded) {
        frames.clear();  // the message holds what it needs of the parts
        if (rdma::link::is_control(*decoded)) {
          if (!c->delivered && decoded->type == "rdma.offer") {
            // A queue pair pins memory: only for a peer that has said hello.
            spdlog::warn("zmq transport: RDMA offer before any message on connection {}: refused", c->id);
            message no;
            no.kind = message_kind::oneway;
            no.type = "rdma.refuse";
            const std::string why = "offer before the hello";
            no.body.assign(why.begin(), why.end());
            send_over_zmq(*c, no);
            continue;
          }
          rdma_of(*c).on_control(*decoded);
          items_dirty_ = true;  // a queue pair may have come or gone
          after_rdma(*c);
          continue;
        }
        messages_received_.fetch_add(1, std::memory_order_relaxed);
        c->delivered = true;
        notify(events_.on_message, "on_message", c->id, std::move(*decoded));
        continue;
      }
      reason = error_text(decoded.error());
    }
    bad_messages_.fetch_add(1, std::memory_order_relaxed);
    if (c->bad_log.allow())
      spdlog::warn("zmq transport: dropped a bad message on connection {}: {}{}", c->id, reason, c->bad_log.note());
    notify(events_.on_bad_message, "on_bad_message", c->id, reason);
  }
}

// ---- commands -------------------------------------------------------------------

void zmq_transport::impl::run_commands() {
  // Handlers called while running a command may push more; loop until dry.
  for (int round = 0; round < 16; ++round) {
    std::vector<command> batch;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (queue_.empty()) return;
      batch.swap(queue_);
    }
    const auto now = clock_type::now();
    for (auto& cmd : batch) {
      switch (cmd.what) {
        case command::op::connect: open_dealer(cmd); break;
        case command::op::send: {
          auto it = conns_.find(cmd.conn);
          if (it == conns_.end() || cmd.shared->drop_queued.load()) break;  // closed meanwhile: dropped
          enqueue(*it->second, std::move(cmd.message), now);
          break;
        }
        case command::op::set_profile: {
          auto it = conns_.find(cmd.conn);
          if (it == conns_.end()) break;
          it->second->shaper.set_profile(cmd.profile);
          it->second->shaped = !cmd.profile.unshaped();
          break;
        }
        case command::op::close:
          if (cmd.drain.count() > 0)
            close_when_drained(cmd.conn, cmd.drain, now);
          else
            close_connection(cmd.conn);
          break;
        case command::op::offer_rdma: {
          auto it = conns_.find(cmd.conn);
          if (it == conns_.end()) break;
          rdma_of(*it->second).offer();
          items_dirty_ = true;
          after_rdma(*it->second);
          break;
        }
      }
    }
  }
}

void zmq_transport::impl::open_dealer(command& cmd) {
  if (cmd.shared->drop_queued.load()) return;  // closed (without draining) before it was opened
  auto c = std::make_unique<connection>();
  c->id = cmd.conn;
  c->outgoing = true;
  c->endpoint = cmd.endpoint;
  c->shared = cmd.shared;
  c->shaper = link_shaper(opts_.default_profile, opts_.shaping_seed + c->id);
  c->shaped = !opts_.default_profile.unshaped();
  c->out = outbox(opts_.fragment_bytes);
  c->in = reassembler(opts_.limits);

  auto fail = [&](const std::string& why) {
    spdlog::error("zmq transport: connection {} to {}: {}", c->id, cmd.endpoint, why);
    close_socket(c->socket, c->monitor);
    cmd.shared->closed.store(true);
    unregister_shared(c->id);
    notify(events_.on_disconnect, "on_disconnect", c->id);
  };
  c->socket = zmq_socket(ctx_, ZMQ_DEALER);
  if (!c->socket) return fail(zmq_error_text("DEALER socket"));
  apply_common_options(c->socket);
  // No ZMQ_IMMEDIATE: messages sent before the connection is up (or while
  // it reconnects) must queue in the pipe, not fail.
  detail::set_int_option(c->socket, ZMQ_RECONNECT_IVL, 100);
  detail::set_int_option(c->socket, ZMQ_RECONNECT_IVL_MAX, 1000);
  if (!opts_.identity.empty()) {
    // A second connection of this node to the same peer needs its own
    // routing id (the peer's ROUTER would hand the first one over to it);
    // the first keeps the plain identity so a restarted node takes over.
    auto& used = suffixes_[cmd.endpoint];
    int suffix = 0;
    while (used.count(suffix)) ++suffix;
    used.insert(suffix);
    c->suffix = suffix;
    const std::string rid = suffix == 0 ? opts_.identity : opts_.identity + "#" + std::to_string(suffix);
    zmq_setsockopt(c->socket, ZMQ_ROUTING_ID, rid.data(), rid.size());
  }
  if (opts_.curve.enabled) {
    zmq_setsockopt(c->socket, ZMQ_CURVE_SERVERKEY, cmd.server_key.data(), 40);
    zmq_setsockopt(c->socket, ZMQ_CURVE_PUBLICKEY, opts_.curve.public_key.data(), 40);
    zmq_setsockopt(c->socket, ZMQ_CURVE_SECRETKEY, opts_.curve.secret_key.data(), 40);
  }
  if (auto err = attach_monitor(c->socket, std::to_string(c->id), c->monitor); !err.empty()) {
    if (!opts_.identity.empty()) suffixes_[cmd.endpoint].erase(c->suffix);
    return fail(err);
  }
  if (zmq_connect(c->socket, cmd.endpoint.c_str()) != 0) {
    if (!opts_.identity.empty()) suffixes_[cmd.endpoint].erase(c->suffix);
    return fail(zmq_error_text("zmq_connect"));
  }
  spdlog::debug("zmq transport: connection {} connecting to {}", c->id, cmd.endpoint);
  conns_[c->id] = std::move(c);
  items_dirty_ = true;
}

void zmq_transport::impl::close_when_drained(connection_id id, std::chrono::milliseconds drain,
                                             clock_type::time_point now) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  connection& c = *it->second;
  if (queued_count(c) == 0) return close_connection(id, drain);
  c.close_at = now + drain;
  closing_.push_back(id);
}

void zmq_transport::impl::finish_closing(clock_type::time_point now) {
  for (std::size_t i = 0; i < closing_.size();) {
    auto it = conns_.find(closing_[i]);
    if (it == conns_.end()) {  // closed meanwhile (peer gone, teardown)
      closing_.erase(closing_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    connection& c = *it->second;
    if (queued_count(c) > 0 && now < *c.close_at) {
      ++i;
      continue;
    }
    if (queued_count(c) > 0)
      spdlog::debug("zmq transport: connection {} closed with {} messages still queued (drain time up)", c.id,
                    queued_count(c));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*c.close_at - now);
    closing_.erase(closing_.begin() + static_cast<std::ptrdiff_t>(i));
    close_connection(c.id, std::max(left, std::chrono::milliseconds{1}));
  }
}

void zmq_transport::impl::close_connection(connection_id id, std::chrono::milliseconds linger) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  connection& c = *it->second;
  c.shared->closed.store(true);
  if (c.outgoing) {
    close_socket(c.socket, c.monitor, linger);
    if (!opts_.identity.empty()) {
      auto used = suffixes_.find(c.endpoint);
      if (used != suffixes_.end()) {
        used->second.erase(c.suffix);
        if (used->second.empty()) suffixes_.erase(used);
      }
    }
    items_dirty_ = true;
  } else {
    by_routing_id_.erase(c.routing_id);
    if (c.peer_fd >= 0) {
      auto f = by_fd_.find(c.peer_fd);
      if (f != by_fd_.end() && f->second == id) by_fd_.erase(f);
    }
  }
  if (c.listed) with_pending_.erase(std::find(with_pending_.begin(), with_pending_.end(), &c));
  c.shared->queued.fetch_sub(queued_count(c));
  if (with_rdma_.erase(id)) items_dirty_ = true;
  conns_.erase(it);
  unregister_shared(id);
}

// ---- sending --------------------------------------------------------------------

void zmq_transport::impl::add_pending(connection& c) {
  if (c.listed) return;
  c.listed = true;
  with_pending_.push_back(&c);
}

void zmq_transport::impl::enqueue(connection& c, out_message&& m, clock_type::time_point now) {
  c.out.push(std::move(m));
  if (c.rdma_blocked || (c.blocked && c.outgoing))
    pump(c, now);  // what may go joins `pending`; POLLOUT or the RDMA path's drain sends it
  else
    flush(c, now);
  if (!c.out.empty() || !c.pending.empty()) add_pending(c);
}

void zmq_transport::impl::pump(connection& c, clock_type::time_point now) {
  for (;;) {
    // Fragments go on while ZeroMQ holds less than the window of them, and
    // (shaped) the emulated link frees up within the lookahead, or
    // (unshaped) the last one has reached ZeroMQ: so whatever is sent next
    // waits behind at most about a window of bytes.
    const bool room = c.shared->bulk_in_zmq.load(std::memory_order_relaxed) < bulk_window_ &&
                      (c.shaped ? c.shaper.link_free() <= now + shaping_lookahead : c.pending_fragments == 0);
    // The RDMA path moves a large message without holding up the rest.
    const bool fragment = !(c.rdma && c.rdma->sending());
    auto unit = c.out.next(room, fragment);
    if (!unit) return;
    // Shaped from the moment send() was called, not when this thread got it.
    unit->due = c.shaped ? c.shaper.schedule(unit->bytes, unit->due) : now;
    if (unit->fragment) ++c.pending_fragments;
    c.pending.push_back(std::move(*unit));
  }
}

void zmq_transport::impl::flush(connection& c, clock_type::time_point now) {
  c.blocked = false;
  pump(c, now);
  while (!c.pending.empty() && c.pending.front().due <= now) {
    const int err = transmit(c, c.pending.front());
    if (err == EAGAIN) {
      c.blocked = true;
      return;
    }
    if (err == EBUSY) {
      c.rdma_blocked = true;
      return;
    }
    const bool fragment = c.pending.front().fragment;
    if (c.pending.front().last) c.shared->queued.fetch_sub(1);
    if (fragment) --c.pending_fragments;
    c.pending.pop_front();
    if (err == EHOSTUNREACH) return peer_gone(c, "unreachable");
    if (fragment || c.pending.empty()) pump(c, now);  // room for the next fragment
  }
}

std::size_t zmq_transport::impl::queued_count(const connection& c) {
  std::size_t n = c.out.size();
  for (const auto& u : c.pending) n += u.last ? 1 : 0;
  return n;
}

void zmq_transport::impl::drop_queued(connection& c) {
  c.shared->queued.fetch_sub(queued_count(c));
  c.pending.clear();
  c.pending_fragments = 0;
  c.out.clear();
  c.blocked = false;
}

void zmq_transport::impl::peer_gone(connection& c, const char* why) {
  // Only a ROUTER peer can be unreachable: drop what waits for it; a
  // message from it later brings the connection back.
  spdlog::debug("zmq transport: incoming connection {} {}: dropping {} queued messages", c.id, why,
                queued_count(c));
  drop_queued(c);
  c.shared->peer_gone.store(true);
  mark_down(c);
}

int zmq_transport::impl::transmit(connection& c, const out_message& m) {
  if (c.rdma && c.rdma->sending() && !m.tcp_only) {
    if (c.rdma->backlog_full()) return EBUSY;  // waits in `pending` until the path drains
    c.rdma->send(m.frames);
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(m.bytes, std::memory_order_relaxed);
    return 0;
  }
  void* socket = c.socket;
  if (!c.outgoing) {
    socket = router_;
    if (!socket) return EHOSTUNREACH;
    const out_frame rid{c.routing_id.data(), c.routing_id.size(), nullptr};
    if (const int err = detail::send_frame(socket, rid, true); err != 0) return err;
  }
  // A fragment's payload is owned by one token while ZeroMQ holds it, so
  // the connection knows how much bulk data waits inside ZeroMQ (pump()).
  const std::vector<out_frame>* frames = &m.frames;
  std::vector<out_frame> tracked;
  if (m.fragment) {
    auto token = std::make_shared<bulk_token>();
    token->shared = c.shared;
    token->wake_fd = wake_fd_;
    tracked.reserve(m.frames.size());
    tracked.push_back(m.frames[0]);
    for (std::size_t i = 1; i < m.frames.size(); ++i) {
      token->owners.push_back(m.frames[i].owner);
      token->bytes += m.frames[i].size;
      tracked.push_back(out_frame{m.frames[i].data, m.frames[i].size, std::shared_ptr<const void>(token, m.frames[i].data)});
    }
    c.shared->bulk_in_zmq.fetch_add(token->bytes, std::memory_order_relaxed);
    frames = &tracked;
  }
  for (std::size_t i = 0; i < frames->size(); ++i) {
    const int err = detail::send_frame(socket, (*frames)[i], i + 1 < frames->size());
    if (err == 0) continue;
    // Once the first part is accepted ZeroMQ takes the rest of the message
    // (the high-water mark counts whole messages), so only part 0 can fail
    // with EAGAIN or EHOSTUNREACH.
    if (i == 0 && c.outgoing) return err;
    spdlog::error("zmq transport: connection {}: {} (frame {} of {}); message lost", c.id,
                  zmq_strerror(err), i + 1, m.frames.size());
    return 0;
  }
  if (m.fragment) fragments_sent_.fetch_add(1, std::memory_order_relaxed);
  if (m.last) messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(m.bytes, std::memory_order_relaxed);
  return 0;
}

// ---- RDMA path --------------------------------------------------------------------

rdma::link& zmq_transport::impl::rdma_of(connection& c) {
  if (c.rdma) return *c.rdma;
  const connection_id id = c.id;
  rdma::link::hooks h;
  h.send_control = [this, id](message&& m) {
    auto it = conns_.find(id);
    if (it != conns_.end()) send_over_zmq(*it->second, m);
  };
  h.deliver = [this, id](message&& m) {
    std::uint64_t bytes = m.body.size();
    for (const auto& t : m.tensors) bytes += t.defined() ? t.nbytes() : 0;
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    messages_received_.fetch_add(1, std::memory_order_relaxed);
    rdma_messages_received_.fetch_add(1, std::memory_order_relaxed);
    notify(events_.on_message, "on_message", id, std::move(m));
  };
  h.bad = [this, id](const std::string& reason) {
    bad_messages_.fetch_add(1, std::memory_order_relaxed);
    auto it = conns_.find(id);
    if (it != conns_.end() && it->second->bad_log.allow())
      spdlog::warn("zmq transport: dropped a bad RDMA message on connection {}: {}{}", id, reason,
                   it->second->bad_log.note());
    notify(events_.on_bad_message, "on_bad_message", id, reason);
  };
  h.changed = [this, id](bool up, const std::string& reason) {
    spdlog::log(up ? spdlog::level::info : spdlog::level::debug, "zmq transport: connection {} {} RDMA: {}", id,
                up ? "now runs over" : "does not use", reason);
    notify(events_.on_rdma, "on_rdma", id, up, reason);
  };
  h.admit = [this]() -> std::string {
    std::size_t open = 0;
    for (connection_id other : with_rdma_) {
      auto it = conns_.find(other);
      if (it != conns_.end() && it->second->rdma && it->second->rdma->has_queue_pair()) ++open;
    }
    if (open >= max_queue_pairs)
      return "this node already has " + std::to_string(open) + " RDMA queue pairs (the limit)";
    return "";
  };
  c.rdma = std::make_unique<rdma::link>(opts_.rdma_device, opts_.limits, opts_.send_checksums, std::move(h));
  with_rdma_.insert(id);
  return *c.rdma;
}

void zmq_transport::impl::send_over_zmq(connection& c, const message& m) {
  out_message o;
  o.frames = encode(m, false);
  for (const auto& f : o.frames) o.bytes += f.size;
  o.tcp_only = true;
  o.barrier = true;  // switch markers keep the order of everything around them
  o.due = clock_type::now();
  c.shared->queued.fetch_add(1);
  enqueue(c, std::move(o), o.due);
}

void zmq_transport::impl::rdma_progress() {
  if (with_rdma_.empty()) return;
  // Handlers run inside: walk a copy (kept in a member, so a loop turn
  // allocates nothing once it has grown).
  rdma_ids_.assign(with_rdma_.begin(), with_rdma_.end());
  for (connection_id id : rdma_ids_) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second->rdma) continue;
    connection& c = *it->second;
    const std::uint64_t before = c.rdma->messages_sent();
    if (!c.rdma->progress()) items_dirty_ = true;
    rdma_messages_sent_.fetch_add(c.rdma->messages_sent() - before, std::memory_order_relaxed);
    after_rdma(c);
  }
}

void zmq_transport::impl::after_rdma(connection& c) {
  if (c.rdma->take_failure()) report_rdma_loss(c);
  // Messages held back for the RDMA path go out once it drained (or over
  // ZeroMQ, if the path is gone).
  if (c.rdma_blocked && (!c.rdma->sending() || !c.rdma->backlog_full())) {
    c.rdma_blocked = false;
    flush(c, clock_type::now());
  }
}

void zmq_transport::impl::report_rdma_loss(connection& c) {
  // Messages on the lost path may be gone: report the connection down and
  // up again, as after a TCP reconnect, so links re-run their hello (over
  // TCP now) and requests in flight fail instead of hanging.
  items_dirty_ = true;
  if (!c.established) return;  // already reported down; its reconnect will say up
  notify(events_.on_disconnect, "on_disconnect", c.id);
  notify(events_.on_connect, "on_connect", c.id);
}

// ---- caller side ------------------------------------------------------------------

void zmq_transport::impl::register_shared(connection_id id, std::shared_ptr<conn_shared> s) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  registry_[id] = std::move(s);
}

void zmq_transport::impl::unregister_shared(connection_id id) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  registry_.erase(id);
}

std::shared_ptr<conn_shared> zmq_transport::impl::shared_of(connection_id conn) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  auto it = registry_.find(conn);
  return it == registry_.end() ? nullptr : it->second;
}

void zmq_transport::impl::push(command&& c) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    was_empty = queue_.empty();
    queue_.push_back(std::move(c));
  }
  // The I/O thread drains the queue before it polls again, so it needs no
  // wake-up from itself, and one per burst from anyone else.
  if (was_empty && current_io_owner != this) {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
}

connection_id zmq_transport::impl::connect(const std::string& endpoint, const std::string& server_key) {
  if (opts_.curve.enabled) {
    if (server_key.empty())
      throw std::invalid_argument("connect to " + endpoint +
                                  ": CurveZMQ is enabled, so the server's public key is required");
    if (!detail::is_z85_key(server_key))
      throw std::invalid_argument("connect to " + endpoint + ": server public key \"" + server_key +
                                  "\" is not 40 Z85 characters");
  }
  command c;
  c.what = command::op::connect;
  c.conn = next_id_.fetch_add(1);
  c.shared = std::make_shared<conn_shared>();
  c.endpoint = endpoint;
  c.server_key = server_key;
  register_shared(c.conn, c.shared);
  const connection_id id = c.conn;
  push(std::move(c));
  return id;
}

bool zmq_transport::impl::send(connection_id conn, const message& m) {
  auto shared = shared_of(conn);
  if (!shared || shared->closed.load() || shared->peer_gone.load()) return false;
  if (shared->queued.load() >= queue_limit_) return false;
  command c;
  c.what = command::op::send;
  c.conn = conn;
  c.message.due = clock_type::now();
  c.message.frames = encode(m, opts_.send_checksums);
  for (const auto& f : c.message.frames) c.message.bytes += f.size;
  c.message.lane = lane_of(m);
  c.message.barrier = is_barrier(m);
  shared->queued.fetch_add(1);
  c.shared = std::move(shared);
  push(std::move(c));
  return true;
}

bool zmq_transport::impl::command_for(connection_id conn, command::op what, command& c) {
  c.shared = shared_of(conn);
  if (!c.shared) return false;
  c.what = what;
  c.conn = conn;
  return true;
}

void zmq_transport::impl::set_profile(connection_id conn, const link_profile& p) {
  command c;
  if (!command_for(conn, command::op::set_profile, c)) return;
  c.profile = p;
  push(std::move(c));
}

void zmq_transport::impl::offer_rdma(connection_id conn) {
  command c;
  if (command_for(conn, command::op::offer_rdma, c)) push(std::move(c));
}

void zmq_transport::impl::close(connection_id conn, std::chrono::milliseconds drain) {
  auto shared = shared_of(conn);
  if (!shared) return;
  shared->closed.store(true);
  if (drain.count() <= 0) shared->drop_queued.store(true);
  unregister_shared(conn);
  command c;
  c.what = command::op::close;
  c.conn = conn;
  c.shared = std::move(shared);
  c.drain = drain;
  push(std::move(c));
}

// ---- public face ----------------------------------------------------------------

caf::expected<std::unique_ptr<zmq_transport>> zmq_transport::start(transport_options options,
                                                                   transport_events events) {
  auto p = std::make_unique<impl>(std::move(options), std::move(events));
  if (auto err = p->validate(); !err.empty()) return caf::make_error(caf::sec::invalid_argument, err);
  if (auto err = p->open(); !err.empty()) return caf::make_error(caf::sec::runtime_error, err);
  std::promise<std::string> ready;
  auto result = ready.get_future();
  p->io_ = std::thread([raw = p.get(), &ready] { raw->run(ready); });
  if (auto err = result.get(); !err.empty()) {
    p->io_.join();
    return caf::make_error(caf::sec::cannot_open_port, err);
  }
  return std::unique_ptr<zmq_transport>(new zmq_transport(std::move(p)));
}

zmq_transport::zmq_transport(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
zmq_transport::~zmq_transport() = default;

std::string zmq_transport::endpoint() const { return impl_->endpoint_; }
connection_id zmq_transport::connect(const std::string& endpoint, const std::string& server_public_key) {
  return impl_->connect(endpoint, server_public_key);
}
bool zmq_transport::send(connection_id conn, const message& m) { return impl_->send(conn, m); }
void zmq_transport::set_profile(connection_id conn, const link_profile& p) { impl_->set_profile(conn, p); }
void zmq_transport::close(connection_id conn, std::chrono::milliseconds drain) { impl_->close(conn, drain); }
void zmq_transport::offer_rdma(connection_id conn) { impl_->offer_rdma(conn); }
std::string zmq_transport::rdma_device() const {
  return impl_->opts_.rdma_device ? impl_->opts_.rdma_device->name() : "";
}

zmq_transport::counters zmq_transport::stats() const {
  counters c;
  c.messages_sent = impl_->messages_sent_.load();
  c.messages_received = impl_->messages_received_.load();
  c.bytes_sent = impl_->bytes_sent_.load();
  c.bytes_received = impl_->bytes_received_.load();
  c.bad_messages = impl_->bad_messages_.load();
  c.rdma_messages_sent = impl_->rdma_messages_sent_.load();
  c.rdma_messages_received = impl_->rdma_messages_received_.load();
  c.fragments_sent = impl_->fragments_sent_.load();
  c.fragments_received = impl_->fragments_received_.load();
  return c;
}

}  // namespace corolla::net
