// actors/dialback.hpp — whether a listening node can be reached from the
// swarm: it asks a peer that offers relaying to dial it back at the
// endpoint it would announce (as libp2p's AutoNAT does). A server that
// cannot be dialled uses a relay instead (apps/serve_relay.hpp).
//
// Every node started with relay_service publishes the "reach" actor. It
// answers "reach.dialback" (body wire::DialBack) with "reach.result"
// (wire::DialBackResult): it opens a fresh connection to the endpoint,
// waits for the hello, and says whether the node that asked answered
// there, then closes that connection. It dials one endpoint at a time, at
// most dialback_per_minute a minute, and only for a peer over a link: it
// cannot be used to probe third parties for anyone outside the swarm, and
// it reports only whether the asker itself answered.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

namespace corolla {

class node;
struct node_context;

/// Name the reach actor is published under.
inline constexpr const char* reach_actor_name = "reach";
inline constexpr int dialback_per_minute = 30;

namespace reach_msg {
inline constexpr const char* dialback = "reach.dialback";  ///< node -> helper
inline constexpr const char* result = "reach.result";      ///< the answer
}  // namespace reach_msg

/// Spawns the reach actor of the node of `ctx`.
caf::actor spawn_reach_actor(caf::actor_system& system, std::shared_ptr<node_context> ctx);

/// What a dial-back found.
struct reach_result {
  bool reached = false;
  std::string reason;  ///< why not ("" when reached)
};

/// Asks `helper` (a connected peer offering relaying) to dial `n` back at
/// `endpoint`. Errors: the request's (errc::unknown_actor when the helper
/// offers no dial-backs, errc::busy-like refusals as errc::invalid_argument
/// with the reason).
caf::expected<reach_result> request_dialback(node& n, const std::string& helper, const std::string& endpoint,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(8));

}  // namespace corolla
