// net/rdma_link.cpp — the RDMA upgrade of one connection (see rdma_link.hpp).
#include "net/rdma_link.hpp"

#include <stdexcept>

#include <spdlog/spdlog.h>

#include "net/rdma_channel.hpp"

namespace corolla::net::rdma {

namespace {

constexpr const char* offer_type = "rdma.offer";
constexpr const char* accept_type = "rdma.accept";
constexpr const char* refuse_type = "rdma.refuse";
constexpr const char* ready_type = "rdma.ready";
constexpr const char* switch_type = "rdma.switch";
constexpr const char* down_type = "rdma.down";
/// RDMA messages held while the peer's switch marker is on its way; more
/// means the marker is not coming.
constexpr std::size_t max_held = 4096;
/// Depth of each queue pair: every receive slot plus the send queue.
constexpr int queue_depth = recv_slots + max_outstanding;
/// Backpressure: messages waiting for credits, and rendezvous bytes the peer
/// has not read yet, beyond which the transport holds further sends.
constexpr std::size_t max_backlog_messages = 1024;
constexpr std::uint64_t max_backlog_bytes = std::uint64_t{2} << 30;

}  // namespace

link::link(std::shared_ptr<device> dev, decode_limits limits, bool checksums, hooks h)
    : dev_(std::move(dev)), limits_(limits), checksums_(checksums), hooks_(std::move(h)) {}

link::~link() = default;

bool link::is_control(const message& m) {
  return m.kind == message_kind::oneway && m.target_actor.empty() && m.type.rfind("rdma.", 0) == 0;
}

void link::control(const char* type, std::vector<std::uint8_t> body) {
  message m;
  m.kind = message_kind::oneway;
  m.type = type;
  m.body = std::move(body);
  hooks_.send_control(std::move(m));
}

void link::refuse(const std::string& why) { control(refuse_type, std::vector<std::uint8_t>(why.begin(), why.end())); }

void link::drop(const std::string& why, bool report) {
  if (channel_) {
    const auto s = channel_->stats();
    sent_before_ += s.messages_sent;
    received_before_ += s.messages_received;
  }
  channel_.reset();
  held_.clear();
  state_ = state::idle;
  peer_switched_ = false;
  if (report) hooks_.changed(false, why);
}

void link::reset() {
  // A new TCP connection is a fresh start: RDMA may be offered again.
  failed_.clear();
  drop("the TCP connection was lost", state_ != state::idle);
}

void link::fail(const std::string& why, bool tell_peer) {
  failed_ = why;
  failure_pending_ = true;
  spdlog::error("rdma: {}; the connection goes back to TCP", why);
  if (tell_peer) control(down_type, std::vector<std::uint8_t>(why.begin(), why.end()));
  drop("RDMA failed: " + why, true);
}

bool link::take_failure() {
  const bool f = failure_pending_;
  failure_pending_ = false;
  return f;
}

void link::offer() {
  if (!dev_) return hooks_.changed(false, "this node has no RDMA device");
  if (!failed_.empty()) return hooks_.changed(false, "RDMA failed earlier on this connection (" + failed_ + ")");
  if (state_ != state::idle) return;
  if (hooks_.admit)
    if (std::string why = hooks_.admit(); !why.empty()) return hooks_.changed(false, why);
  try {
    channel_ = std::make_unique<channel>(dev_->create_queue_pair(queue_depth), limits_, checksums_);
  } catch (const std::exception& e) {
    channel_.reset();
    return hooks_.changed(false, std::string("cannot create an RDMA queue pair: ") + e.what());
  }
  state_ = state::offered;
  control(offer_type, channel_->local_address().encode());
}

void link::on_control(const message& m) {
  const std::string& type = m.type;
  auto address = [&]() { return qp_address::decode(m.body.data(), m.body.size()); };
  if (type == offer_type) {
    if (!dev_) return refuse("the peer has no RDMA device");
    if (!failed_.empty()) return refuse("RDMA failed earlier on this connection (" + failed_ + ")");
    if (state_ != state::idle) {
      // The peer started over (its side of the connection was reset): what
      // is queued or held on the old path is lost.
      failure_pending_ = true;
      drop("the peer offered RDMA again; the old queue pair is dropped", true);
    }
    if (hooks_.admit)
      if (std::string why = hooks_.admit(); !why.empty()) return refuse("the peer cannot take more RDMA links: " + why);
    try {
      const qp_address remote = address();
      channel_ = std::make_unique<channel>(dev_->create_queue_pair(queue_depth), limits_, checksums_);
      channel_->connect(remote);
    } catch (const std::exception& e) {
      channel_.reset();
      return refuse(std::string("the peer cannot set up its queue pair: ") + e.what());
    }
    state_ = state::accepted;
    control(accept_type, channel_->local_address().encode());  // may reset us (peer gone)
  } else if (type == accept_type) {
    if (state_ != state::offered) return;  // stale: we gave up on that offer
    try {
      channel_->connect(address());
    } catch (const std::exception& e) {
      const std::string why = std::string("cannot connect the RDMA queue pair: ") + e.what();
      refuse(why);
      return drop(why, true);
    }
    state_ = state::up;
    control(ready_type, {});
    if (!channel_) return;  // the send found the peer gone and reset us
    hooks_.changed(true, "RDMA RC queue pair on " + dev_->name());
  } else if (type == ready_type) {
    if (state_ != state::accepted) return;
    peer_switched_ = true;
    flush_held();
    state_ = state::up;
    control(switch_type, {});
    if (!channel_) return;
    hooks_.changed(true, "RDMA RC queue pair on " + dev_->name());
  } else if (type == switch_type) {
    if (state_ != state::up) return;
    peer_switched_ = true;
    flush_held();
  } else if (type == refuse_type) {
    if (state_ == state::idle) return;
    drop("the peer refused RDMA: " + std::string(m.body.begin(), m.body.end()), true);
  } else if (type == down_type) {
    if (state_ == state::idle) return;
    // Deliver what the peer's path carried before it broke (everything it
    // sent over TCP after this marker comes after), then fall back too.
    progress();
    if (state_ == state::idle) return;  // our side failed while draining
    fail("the peer's RDMA path failed (" + std::string(m.body.begin(), m.body.end()) + ")", false);
  } else {
    spdlog::warn("rdma: unknown control message '{}' dropped", type);
  }
}

bool link::backlog_full() const {
  return channel_ && (channel_->queued() >= max_backlog_messages || channel_->rendezvous_bytes_out() >= max_backlog_bytes);
}

void link::send(std::vector<out_frame> frames) {
  if (!channel_ || state_ != state::up) throw std::logic_error("rdma::link::send while the RDMA path is not up");
  channel_->send_frames(std::move(frames));
}

void link::flush_held() {
  while (!held_.empty()) {
    message m = std::move(held_.front());
    held_.pop_front();
    hooks_.deliver(std::move(m));
  }
}

bool link::progress() {
  if (!channel_) return true;
  std::string overflow;
  const bool ok = channel_->progress(
      [&](message&& m) {
        if (peer_switched_) return hooks_.deliver(std::move(m));
        if (held_.size() >= max_held) {
          overflow = "more than " + std::to_string(max_held) + " RDMA messages arrived before the peer's switch marker";
          return;
        }
        held_.push_back(std::move(m));
      },
      hooks_.bad);
  if (ok && overflow.empty()) return true;
  fail(ok ? overflow : channel_->failure(), true);
  return false;
}

int link::event_fd() const { return channel_ ? channel_->event_fd() : -1; }

void link::arm() {
  if (channel_) channel_->arm();
}

std::uint64_t link::messages_sent() const {
  return sent_before_ + (channel_ ? channel_->stats().messages_sent : 0);
}

std::uint64_t link::messages_received() const {
  return received_before_ + (channel_ ? channel_->stats().messages_received : 0);
}

}  // namespace corolla::net::rdma
