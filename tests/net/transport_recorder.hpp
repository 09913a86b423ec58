// tests/net/transport_recorder.hpp — records what a zmq_transport reports,
// so tests can wait (with a bound) for messages and connection events.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "net/zmq_transport.hpp"

namespace corolla::net::testing {

using namespace std::chrono_literals;

/// Every event of one transport, with the arrival time of each message.
/// Handlers run on the transport's I/O thread; tests read under the lock
/// through wait_for() / snapshot().
struct transport_recorder {
  struct received {
    connection_id conn;
    message msg;
    shaping_clock::time_point at;
  };

  std::mutex mu;
  std::condition_variable cv;
  std::vector<received> messages;
  std::vector<std::pair<connection_id, std::string>> bad, accepted;
  std::vector<connection_id> connects, disconnects;
  std::vector<std::string> auth_failures;
  struct rdma_event {
    connection_id conn;
    bool up;
    std::string reason;
  };
  std::vector<rdma_event> rdma_events;
  /// Optional hook run on the I/O thread for each message (e.g. an echo).
  std::function<void(connection_id, const message&)> on_message_hook;

  transport_events events() {
    transport_events e;
    e.on_message = [this](connection_id c, message&& m) {
      const auto now = shaping_clock::now();
      if (on_message_hook) on_message_hook(c, m);
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back({c, std::move(m), now});
      cv.notify_all();
    };
    e.on_bad_message = [this](connection_id c, const std::string& why) { record(bad, std::make_pair(c, why)); };
    e.on_accept = [this](connection_id c, const std::string& rid) { record(accepted, std::make_pair(c, rid)); };
    e.on_connect = [this](connection_id c) { record(connects, c); };
    e.on_disconnect = [this](connection_id c) { record(disconnects, c); };
    e.on_auth_failure = [this](net::connection_id, const std::string& why) { record(auth_failures, why); };
    e.on_rdma = [this](connection_id c, bool up, const std::string& why) { record(rdma_events, rdma_event{c, up, why}); };
    return e;
  }

  /// Waits until `done()` (called under the lock) holds; false at the timeout.
  bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds timeout = 5000ms) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, done);
  }
  bool wait_messages(std::size_t n, std::chrono::milliseconds timeout = 5000ms) {
    return wait_for([&] { return messages.size() >= n; }, timeout);
  }
  template <class T>
  static bool contains(const std::vector<T>& v, const T& x) {
    for (const auto& e : v)
      if (e == x) return true;
    return false;
  }

 private:
  template <class V, class T>
  void record(V& v, T&& x) {
    std::lock_guard<std::mutex> lock(mu);
    v.push_back(std::forward<T>(x));
    cv.notify_all();
  }
};

/// Starts a transport or fails the test with the reason.
inline std::unique_ptr<zmq_transport> start_transport(transport_options o, transport_recorder& r) {
  auto t = zmq_transport::start(std::move(o), r.events());
  REQUIRE_MESSAGE(t, "transport did not start: " << error_text(t));
  return std::move(*t);
}

/// Options of a node listening on a free loopback port.
inline transport_options loopback_options(const std::string& identity) {
  transport_options o;
  o.listen = "tcp://127.0.0.1:0";
  o.identity = identity;
  return o;
}

/// A message with a body and the given tensors.
inline message make_message(message_kind kind, std::uint64_t correlation, std::vector<Tensor> tensors = {}) {
  message m;
  m.kind = kind;
  m.sender_node = "test";
  m.target_actor = "echo";
  m.type = "test";
  m.correlation_id = correlation;
  m.body = {1, 2, 3, 4, 5};
  m.tensors = std::move(tensors);
  return m;
}

}  // namespace corolla::net::testing
