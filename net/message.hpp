// net/message.hpp — a message between actors of different processes, as it
// exists in memory on either side of the wire (see docs/protocol.md).
//
// On the wire a message is one Cap'n Proto frame (the Envelope of
// net/wire.capnp, carrying the application body and one TensorHeader per
// tensor) followed by one raw frame per tensor. Tensors never travel inside
// a Cap'n Proto Data field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace corolla::net {

/// The protocol version this build speaks; peers with another version are
/// refused during the hello exchange.
inline constexpr std::uint32_t protocol_version = 2;  // 2: fragments (net/fragment.hpp)

/// What an envelope is for (mirrors wire.capnp's MessageKind).
enum class message_kind : std::uint8_t {
  hello,          ///< first message on a connection: body = wire::Hello
  hello_ack,      ///< accepted: body = wire::Hello of the answering node
  hello_reject,   ///< refused: error_message says why; the connection is closed
  heartbeat,      ///< liveness probe; sent_at_ns echoed back
  heartbeat_ack,  ///< answer to a heartbeat, same correlation id
  request,        ///< expects exactly one response or error with its correlation id
  response,       ///< answer to a request
  error,          ///< failed request, or a message that could not be delivered
  oneway,         ///< fire and forget
  goodbye,        ///< orderly shutdown of the sending node
};

/// How a tensor frame's bytes encode the tensor.
enum class tensor_encoding : std::uint8_t {
  raw,         ///< the tensor's bytes in its dtype
  int8_block,  ///< blockwise absmax int8 (wire compression): f32 scales then i8 values
};

/// One cross-process message.
struct message {
  message_kind kind = message_kind::oneway;
  std::string sender_node;          ///< node id of the sender
  std::string sender_actor;         ///< actor name on the sender's node ("" = anonymous)
  std::string target_actor;         ///< actor name on the receiving node
  std::uint64_t correlation_id = 0; ///< pairs requests with responses; 0 for oneway
  std::string type;                 ///< application message type, e.g. "echo"
  /// Application body: a Cap'n Proto message (flat-array encoding) of the
  /// schema named by `type`, or empty.
  std::vector<std::uint8_t> body;
  /// Tensors (host memory). Sent as separate frames without copying;
  /// received into 64-byte aligned memory (copied only when the transport's
  /// buffer is misaligned).
  std::vector<Tensor> tensors;
  /// Encoding of each tensor on the wire (empty = all raw).
  std::vector<tensor_encoding> encodings;
  std::uint64_t sent_at_ns = 0;     ///< sender's steady clock, for RTT
  std::string error_code;           ///< kind == error: machine-readable code
  std::string error_message;        ///< kind == error / hello_reject: for humans
  /// Relaying (actors/relay.hpp): on a message to a relay, the node id it
  /// is for; the relay clears it when it passes the message on.
  std::string relay_to;
  /// Set by a relay on a message it passes on: the node it came from (as
  /// the relay's link to it authenticated it). "" = not relayed.
  std::string relay_from;
  /// Receiving side only, never on the wire: the CurveZMQ public key (Z85)
  /// that authenticated the connection this message arrived on, for
  /// messages a listening node received under CurveZMQ; "" otherwise.
  std::string peer_key;
};

/// Lower-case name of a kind ("request"), for logs and errors.
const char* kind_name(message_kind k);

}  // namespace corolla::net
