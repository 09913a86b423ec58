// net/zmq_io.cpp — small ZeroMQ helpers of the transport: error text,
// options, monitor events, zero-copy frame sends, received parts.
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

#include <spdlog/spdlog.h>
#include <zmq.h>

#include "net/zmq_detail.hpp"

namespace corolla::net::detail {

static_assert(sizeof(zmq_msg_t) == 64 && alignof(zmq_msg_t) <= 8,
              "received_part stores a zmq_msg_t in 64 bytes");

std::string zmq_error_text(const std::string& what) { return what + ": " + zmq_strerror(zmq_errno()); }

bool set_int_option(void* socket, int option, int value) {
  return zmq_setsockopt(socket, option, &value, sizeof value) == 0;
}

std::optional<monitor_event> read_monitor_event(void* monitor) {
  zmq_msg_t head;
  zmq_msg_init(&head);
  if (zmq_msg_recv(&head, monitor, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&head);
    return std::nullopt;
  }
  monitor_event e;
  // Frame 1: 16-bit event number then 32-bit value, native byte order,
  // unaligned. Frame 2: the endpoint.
  if (zmq_msg_size(&head) >= 6) {
    const auto* p = static_cast<const unsigned char*>(zmq_msg_data(&head));
    std::memcpy(&e.event, p, 2);
    std::memcpy(&e.value, p + 2, 4);
  }
  bool more = zmq_msg_more(&head) != 0;
  zmq_msg_close(&head);
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, monitor, 0) < 0) {
      zmq_msg_close(&part);
      break;
    }
    if (e.endpoint.empty())
      e.endpoint.assign(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
    more = zmq_msg_more(&part) != 0;
    zmq_msg_close(&part);
  }
  return e;
}

namespace {

const char* protocol_error_name(std::uint32_t code) {
  switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND: return "unexpected command";
    case ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE: return "invalid sequence";
    case ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE: return "key exchange failed";
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_UNSPECIFIED:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_MESSAGE:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_INITIATE:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_ERROR:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_READY:
    case ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_WELCOME: return "malformed handshake command";
    case ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_METADATA: return "invalid metadata";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "cryptographic error (wrong server key, or the peer's keys do not match)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "security mechanism mismatch (one side uses CurveZMQ, the other not)";
    case ZMQ_PROTOCOL_ERROR_ZAP_UNSPECIFIED:
    case ZMQ_PROTOCOL_ERROR_ZAP_MALFORMED_REPLY:
    case ZMQ_PROTOCOL_ERROR_ZAP_BAD_REQUEST_ID:
    case ZMQ_PROTOCOL_ERROR_ZAP_BAD_VERSION:
    case ZMQ_PROTOCOL_ERROR_ZAP_INVALID_STATUS_CODE:
    case ZMQ_PROTOCOL_ERROR_ZAP_INVALID_METADATA: return "ZAP handler error";
    default: return "protocol error";
  }
}

}  // namespace

std::string describe_handshake_failure(const monitor_event& e) {
  switch (e.event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      return "authentication refused (ZAP status " + std::to_string(e.value) + ") on " + e.endpoint;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      return std::string("handshake failed: ") + protocol_error_name(e.value) + " on " + e.endpoint;
    default: return "handshake failed (" + std::string(zmq_strerror(static_cast<int>(e.value))) + ") on " + e.endpoint;
  }
}

bool is_auth_failure(const monitor_event& e) {
  if (e.event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return true;
  if (e.event != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) return false;
  return e.value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC || e.value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ||
         e.value == ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE || (e.value & 0xF0000000u) == 0x20000000u;
}

namespace {

// Frames up to this size are copied into the ZeroMQ message: cheaper than
// the allocation and atomic reference counting of a zero-copy message.
constexpr std::size_t copy_below_bytes = 8192;

/// ZeroMQ's free function for zero-copy frames. Runs on a ZeroMQ thread once
/// the frame is sent (or dropped); must never throw.
void release_owner(void* /*data*/, void* hint) noexcept {
  auto* owner = static_cast<std::shared_ptr<const void>*>(hint);
  try {
    delete owner;
  } catch (...) {
    // A storage destructor that throws would be a bug elsewhere; swallowing
    // it here is the only option inside a C callback.
  }
}

}  // namespace

int send_frame(void* socket, const out_frame& f, bool more) {
  zmq_msg_t msg;
  if (f.size <= copy_below_bytes || !f.owner) {
    if (zmq_msg_init_size(&msg, f.size) != 0) return zmq_errno();
    if (f.size > 0) std::memcpy(zmq_msg_data(&msg), f.data, f.size);
  } else {
    auto* hint = new (std::nothrow) std::shared_ptr<const void>(f.owner);
    if (!hint) return ENOMEM;
    if (zmq_msg_init_data(&msg, const_cast<void*>(f.data), f.size, release_owner, hint) != 0) {
      const int err = zmq_errno();
      delete hint;
      return err;
    }
  }
  if (zmq_msg_send(&msg, socket, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0) {
    const int err = zmq_errno();
    zmq_msg_close(&msg);  // releases the owner copy of a zero-copy frame
    return err;
  }
  return 0;
}

received_part::received_part() { zmq_msg_init(reinterpret_cast<zmq_msg_t*>(storage_)); }
received_part::~received_part() { zmq_msg_close(reinterpret_cast<zmq_msg_t*>(storage_)); }
const void* received_part::data() { return zmq_msg_data(reinterpret_cast<zmq_msg_t*>(storage_)); }
std::size_t received_part::size() { return zmq_msg_size(reinterpret_cast<zmq_msg_t*>(storage_)); }
bool received_part::more() { return zmq_msg_more(reinterpret_cast<zmq_msg_t*>(storage_)) != 0; }

}  // namespace corolla::net::detail
