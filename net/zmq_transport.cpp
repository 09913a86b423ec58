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
// Sending and receiving live in zmq_send.cpp and zmq_receive.cpp, running
// the commands (opening and closing connections) in zmq_commands.cpp; the
// state they share is net/zmq_impl.hpp.
//
// Timing: a connection's messages wait in its outbox (lanes, fragments)
// until the link can take them, then in its FIFO until their shaped due
// time; a timerfd armed at the earliest due time (absolute CLOCK_MONOTONIC,
// which is what steady_clock reads) wakes zmq_poll with microsecond
// precision, where zmq_poll's own timeout only has milliseconds.
#include "net/zmq_transport.hpp"

#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <caf/sec.hpp>

#include "net/endpoint.hpp"
#include "net/zmq_impl.hpp"

namespace corolla::net {

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
  if (const std::string why = tcp_listen_problem(opts_.listen); !why.empty()) return "cannot listen: " + why;
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
    // up. (Those held back by ZeroMQ's backlog: its release wakes us; a timer
    // for them would spin.)
    if (c->shaped && !c->out.empty() && c->shaper.link_free() - shaping_lookahead > now)
      next = std::min(next, c->shaper.link_free() - shaping_lookahead);
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
zmq_transport::~zmq_transport() {
  // The last owner may let go on the I/O thread itself: an event handler
  // held a reference (a relay forwarding, say) while its node stopped. That
  // thread cannot join itself, so another one takes the impl and joins it
  // once the handler has returned and the loop has seen stopping_.
  if (impl_ && impl_->io_.get_id() == std::this_thread::get_id())
    std::thread([p = std::move(impl_)]() mutable { p.reset(); }).detach();
}

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
