// net/zmq_detail.hpp — pieces of the ZeroMQ transport shared by its
// translation units (zmq_transport.cpp, zmq_commands.cpp, zmq_send.cpp,
// zmq_receive.cpp, zmq_io.cpp, curve.cpp). Internal:
// nothing outside net/ includes this header, and it keeps <zmq.h> out of the
// public one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "net/codec.hpp"

namespace corolla::net::detail {

/// "<what>: <zmq_strerror(errno)>" for the errno left by the last failed call.
std::string zmq_error_text(const std::string& what);

/// Sets an integer socket option; returns false (errno set) on failure.
bool set_int_option(void* socket, int option, int value);

/// True for a 40-character Z85 string that decodes to a 32-byte key.
bool is_z85_key(const std::string& text);
/// Z85 text (40 characters) of a 32-byte binary key.
std::string z85_of_key(const std::uint8_t* key32);

/// One event read from a socket monitor (ZeroMQ 4.x two-frame format).
struct monitor_event {
  std::uint16_t event = 0;  ///< ZMQ_EVENT_*
  std::uint32_t value = 0;  ///< fd, errno or status code, depending on the event
  std::string endpoint;     ///< for bound sockets the local endpoint, else the peer's
};

/// Reads one pending event from a monitor PAIR socket without blocking.
std::optional<monitor_event> read_monitor_event(void* monitor);

/// "handshake failed: mechanism mismatch" etc. for a HANDSHAKE_FAILED_* event.
std::string describe_handshake_failure(const monitor_event& e);
/// True when a failed handshake means an authentication or encryption
/// problem (CURVE refused or mismatched) rather than a garbled stream.
bool is_auth_failure(const monitor_event& e);

/// Sends one frame without blocking. Frames larger than a few kilobytes go
/// out without copying: ZeroMQ holds a copy of `f.owner` until the kernel has
/// taken the bytes and releases it from its own I/O thread. Returns 0 or the
/// errno of the failure (EAGAIN: high-water mark reached; EHOSTUNREACH: a
/// ROUTER peer that is gone).
int send_frame(void* socket, const out_frame& f, bool more);

/// One received frame, kept alive for as long as any in_frame refers to it
/// (decoded tensors adopt the bytes without copying).
class received_part {
 public:
  received_part();
  ~received_part();
  received_part(const received_part&) = delete;
  received_part& operator=(const received_part&) = delete;
  void* msg() { return &storage_; }
  const void* data();
  std::size_t size();
  bool more();

 private:
  // zmq_msg_t is a 64-byte, 8-byte aligned opaque struct; storing it as bytes
  // keeps <zmq.h> out of this header. Never moved (the part is heap-owned):
  // small messages keep their bytes inside the struct itself.
  alignas(8) unsigned char storage_[64];
};

/// Answers ZAP 1.0 requests (RFC 27) for CURVE: accepts exactly the client
/// public keys in the allow-list, refuses every other one with status 400,
/// logs the refusal with the key and the peer's address, and calls
/// `on_refusal`. Lives on the transport's I/O thread; its REP socket is bound
/// to inproc://zeromq.zap.01 on the transport's own context, which is where
/// libzmq asks.
class zap_handler {
 public:
  zap_handler(const std::vector<std::string>& allowed_z85,
              std::function<void(const std::string& reason)> on_refusal);
  ~zap_handler();
  zap_handler(const zap_handler&) = delete;
  zap_handler& operator=(const zap_handler&) = delete;

  /// Creates and binds the REP socket; "" on success, else the reason.
  std::string bind(void* context);
  void* socket() const { return socket_; }
  /// Serves every pending request without blocking.
  void serve_pending();
  /// Requests refused so far.
  std::uint64_t refusals() const { return refusals_; }

 private:
  void serve_one(std::vector<std::string>& request);

  std::unordered_set<std::string> allowed_;  // Z85 text
  std::function<void(const std::string&)> on_refusal_;
  void* socket_ = nullptr;
  std::uint64_t refusals_ = 0;
  struct log_state {
    std::chrono::steady_clock::time_point last;
    std::uint64_t suppressed = 0;
  };
  std::unordered_map<std::string, log_state> log_;  // per refused key
};

}  // namespace corolla::net::detail
