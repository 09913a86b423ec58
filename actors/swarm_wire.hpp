// actors/swarm_wire.hpp — the bodies of swarm-serving requests (net/wire.capnp:
// SpanInfo, SpanOpen, SpanStep, SpanClose, SpanBatch) as plain structs, and
// their Cap'n Proto encoding. Decoding validates: a malformed body is a
// bad_message error, never an exception.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "model/lora.hpp"

namespace corolla {

/// Request types of the "span" actor.
namespace span_request {
inline constexpr const char* info = "span.info";
inline constexpr const char* open = "span.open";
inline constexpr const char* step = "span.step";
/// One-way, server -> next server of a route: a step's output as the next
/// span's input (body: span_step addressed to the receiver's session).
inline constexpr const char* push = "span.push";
inline constexpr const char* close = "span.close";
inline constexpr const char* forward = "span.forward";
inline constexpr const char* backward = "span.backward";
}  // namespace span_request

/// What a server hosts and how much room it has (wire::SpanInfo).
struct span_info {
  std::string model;
  int first = 0, last = 0, n_blocks = 0, hidden_size = 0;
  std::int64_t max_positions = 0;
  std::int64_t cache_tokens = 0, cache_tokens_left = 0;
  double step_s_per_block = 0;
  std::uint32_t sessions = 0;
  /// RTTs (ms) the server measured to servers of the block after its span,
  /// by node id (at most net::max_rtt_entries, as in its DHT record; what
  /// routing prices server-to-server pushes with).
  std::map<std::string, double> rtt_ms{};
  /// Shutting down: sessions already open go on, span.open is refused.
  bool draining = false;
  /// Steps waiting for their input from the previous server's push.
  std::uint32_t awaiting_pushes = 0;
  /// The dtype of the linear weights its decode reads ("f32", "bf16",
  /// "i8"; "" when an older server does not say).
  std::string weights;
  /// In the answer to a span.open with share_from: the tokens the new
  /// session holds already (0 otherwise, and from older servers).
  std::int64_t shared_tokens = 0;
  /// The LoRA adapters it serves by name (span_open::adapter; at most
  /// max_span_adapters, each a name of up to 256 bytes), sorted.
  std::vector<std::string> adapters{};
  /// Their fingerprints (lora_adapter::digest), in the same order.
  std::vector<std::string> adapter_digests{};
};

/// The most adapter names a span.info may carry.
inline constexpr std::size_t max_span_adapters = 64;

/// wire::SpanOpen.
struct span_open {
  std::string session_id;
  std::int64_t max_length = 0;
  int first = -1, last = -1;  ///< blocks the session runs; -1 = the server's span bound
  bool deep_prompts = false;  ///< tensor 0 of the request: deep prompts [blocks, P, D]
  /// Another session of the same node over the same blocks whose first
  /// share_tokens positions had the inputs this one's will have: the new
  /// session starts holding them (span_engine::share_prefix). "" = none.
  std::string share_from{};
  std::int64_t share_tokens = 0;
  /// The LoRA adapter (one of span_info::adapters) every step takes; "" = none.
  std::string adapter{};
};

/// wire::PushTarget: the next hop a server pushes its output to.
struct push_target {
  std::string node;        ///< node id of the next server
  std::string endpoint;    ///< where to dial it when no link is up
  std::string public_key;  ///< its CurveZMQ key ("" = none)
  std::string session_id;  ///< the session on the next server
};

/// wire::SpanStep.
struct span_step {
  std::string session_id;
  std::int64_t start = 0;
  std::uint64_t step_id = 0;
  bool compress_output = false;  ///< answer with an int8_block tensor
  /// The input does not come with this request: the server `push_from`
  /// pushes it (span.push). The server waits `wait_ms` for it, then answers
  /// an error (timeout).
  bool await_push = false;
  std::string push_from{};
  std::uint32_t wait_ms = 0;
  /// Besides answering, push the output to this next hop (empty node = no).
  push_target push_to{};
  /// A posted route (docs/protocol.md "Posted steps"): the answer and the
  /// push carry, after the output, the inputs of the route's hops after the
  /// first up to this one (what came with the push, then the push itself).
  bool trail = false;
  /// span.push only: the sender could not compute this step, and why (no
  /// tensor comes; the receiver's waiting step fails at once).
  std::string upstream_problem{};
  /// span.push only: the node whose step this is (it owns the sender's
  /// session); the receiver takes the push only for a step of that node.
  std::string owner{};
};

/// wire::SpanStepDone: the answer body of a step that had a push target.
struct span_step_done {
  bool pushed = false;
  std::string push_problem;  ///< why the output was not pushed
};

/// wire::SpanBatch.
struct span_batch {
  int batch = 0, seq = 0;
  bool with_prompts = false;
  int first = -1, last = -1;  ///< blocks of the server's span to run; -1 = its bound
  /// span.forward: a second tensor answers each row's routing margin (f32
  /// [B*T]: span_engine::forward's routing_margins; +inf for a dense model).
  bool with_margins = false;
  /// Compute with this LoRA adapter (one of span_info::adapters); "" = none.
  std::string adapter{};
  /// The client's own adapter, carried (its tensors follow the request's
  /// others: lora_span_values); not with `adapter`.
  std::optional<lora_config> lora{};
};

/// Most target names a carried adapter's config may list on the wire.
inline constexpr std::size_t max_carried_lora_targets = 8;

std::vector<std::uint8_t> encode_body(const span_info& v);
std::vector<std::uint8_t> encode_body(const span_open& v);
std::vector<std::uint8_t> encode_body(const span_step& v);
/// wire::SpanClose with `session_id`.
/// wire::SpanClose: with `keep`, the session is parked (no more steps;
/// its pages serve this node's later span.open shareFrom until the server
/// needs them).
std::vector<std::uint8_t> encode_close_body(const std::string& session_id, bool keep = false);
std::vector<std::uint8_t> encode_body(const span_batch& v);
std::vector<std::uint8_t> encode_body(const span_step_done& v);

caf::expected<span_info> decode_span_info(const std::vector<std::uint8_t>& body);
caf::expected<span_open> decode_span_open(const std::vector<std::uint8_t>& body);
caf::expected<span_step> decode_span_step(const std::vector<std::uint8_t>& body);
struct span_close {
  std::string session_id;
  bool keep = false;
};
caf::expected<span_close> decode_span_close(const std::vector<std::uint8_t>& body);
caf::expected<span_batch> decode_span_batch(const std::vector<std::uint8_t>& body);
caf::expected<span_step_done> decode_span_step_done(const std::vector<std::uint8_t>& body);

}  // namespace corolla
