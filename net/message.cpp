// net/message.cpp — names of message kinds for logs and errors.
#include "net/message.hpp"

namespace corolla::net {

const char* kind_name(message_kind k) {
  switch (k) {
    case message_kind::hello: return "hello";
    case message_kind::hello_ack: return "hello_ack";
    case message_kind::hello_reject: return "hello_reject";
    case message_kind::heartbeat: return "heartbeat";
    case message_kind::heartbeat_ack: return "heartbeat_ack";
    case message_kind::request: return "request";
    case message_kind::response: return "response";
    case message_kind::error: return "error";
    case message_kind::oneway: return "oneway";
    case message_kind::goodbye: return "goodbye";
  }
  return "unknown";
}

}  // namespace corolla::net
