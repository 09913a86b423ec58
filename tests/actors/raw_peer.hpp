// tests/actors/raw_peer.hpp — a bare transport speaking the wire protocol by
// hand, to play a misbehaving peer (wrong protocol version, a peer that goes
// silent after its hello) against a real node.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <doctest/doctest.h>

#include "net/codec.hpp"
#include "net/zmq_transport.hpp"

namespace corolla::testing {

class raw_peer {
 public:
  /// Starts a transport listening on `listen` ("" = connect-only) under `id`
  /// (its routing id), with CurveZMQ when `curve.enabled`.
  explicit raw_peer(std::string id, std::string listen = "", net::curve_options curve = {}) : id_(std::move(id)) {
    net::transport_options o;
    o.listen = std::move(listen);
    o.identity = id_;
    o.curve = std::move(curve);
    net::transport_events ev;
    ev.on_message = [this](net::connection_id conn, net::message&& m) {
      std::lock_guard lock(mutex_);
      inbox_.emplace_back(conn, std::move(m));
      cv_.notify_all();
    };
    auto t = net::zmq_transport::start(std::move(o), std::move(ev));
    REQUIRE_MESSAGE(t, "raw peer transport did not start");
    transport_ = std::move(*t);
  }

  net::zmq_transport& transport() { return *transport_; }
  const std::string& id() const { return id_; }

  /// A hello (or hello_ack) of this peer speaking `version`, claiming node
  /// id `claimed` ("" = its own id).
  net::message hello(net::message_kind kind, std::uint32_t version, const std::string& claimed = "") const {
    net::hello_info h;
    h.protocol_version = version;
    h.node_id = claimed.empty() ? id_ : claimed;
    h.listen_endpoint = transport_->endpoint();
    h.nic_class = "ethernet";
    net::message m;
    m.kind = kind;
    m.sender_node = id_;
    m.body = net::encode_hello(h);
    return m;
  }

  /// The next message of `kind` received within `timeout` (others are
  /// skipped), with its connection.
  std::optional<std::pair<net::connection_id, net::message>> wait_for(net::message_kind kind,
                                                                      std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      while (!inbox_.empty()) {
        auto item = std::move(inbox_.front());
        inbox_.pop_front();
        if (item.second.kind == kind) return item;
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && inbox_.empty()) return std::nullopt;
    }
  }

 private:
  std::string id_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<net::connection_id, net::message>> inbox_;
  std::unique_ptr<net::zmq_transport> transport_;
};

}  // namespace corolla::testing
