// actors/node_control.hpp — what a local fault-injection harness may change
// in a running node: the shaping of everything it sends (a throttled or
// restored uplink), and a partition (every message to and from every peer
// but the harness dropped, both ways, until it is lifted). A node given a
// control token (node_options::control_token; `COROLLA_CONTROL_TOKEN` for
// the apps) publishes the "control" actor, which obeys "control.reshape",
// "control.partition", "control.corrupt" (a published actor of the node
// returns wrong outputs: a broken volunteer), "control.stall" (the work
// a published actor watches stops making progress: a hung rank) and
// "control.lose" (the training mailbox drops the next messages of a type:
// a message lost on the way, which leaves the job waiting) requests
// carrying that token and refuses every other sender; a node without a
// token has no such actor. Bodies: wire::ControlReshape,
// wire::ControlPartition, wire::ControlCorrupt, wire::ControlStall,
// wire::ControlLose (docs/protocol.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/error.hpp>

namespace corolla {

class node;
struct node_context;

/// Name the control actor is published under.
inline constexpr const char* control_actor_name = "control";

namespace control_msg {
inline constexpr const char* reshape = "control.reshape";  ///< harness -> node
inline constexpr const char* partition = "control.partition";  ///< harness -> node
inline constexpr const char* corrupt = "control.corrupt";  ///< harness -> node
inline constexpr const char* stall = "control.stall";      ///< harness -> node
inline constexpr const char* lose = "control.lose";        ///< harness -> node
inline constexpr const char* ok = "control.ok";            ///< the answer
}  // namespace control_msg

/// Shapes everything the node of `ctx` sends with `profile` from now on
/// ("" = as each link was set up), on its links and on links that start
/// later. Errors: errc::invalid_argument for a profile that does not parse.
caf::error reshape_links(node_context& ctx, const std::string& profile);

/// Spawns the control actor of the node of `ctx`, obeying `token` (not empty).
caf::actor spawn_control_actor(caf::actor_system& system, std::shared_ptr<node_context> ctx, std::string token);

/// Asks node `peer` (connected to `n`) to shape its sends with `profile`.
/// Errors: the peer's (errc::auth_refused for a wrong token,
/// errc::unknown_actor when it has no control actor, invalid_argument for a
/// bad profile), or the link's.
caf::error request_reshape(node& n, const std::string& peer, const std::string& token, const std::string& profile,
                           std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Asks node `peer` to drop (on) or stop dropping (off) all traffic with
/// every peer except `n`, which keeps its link (to lift it again). Errors as
/// request_reshape.
caf::error request_partition(node& n, const std::string& peer, const std::string& token, bool on,
                             std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Asks node `peer` to make its actor published as `actor` return wrong
/// outputs (on) or correct ones again (off); the actor must understand
/// corrupt_atom (the span server does). Errors as request_reshape, and
/// errc::unknown_actor when the node publishes no such actor.
caf::error request_corrupt(node& n, const std::string& peer, const std::string& token, const std::string& actor,
                           bool on, std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Asks node `peer` to stall (on) or resume (off) the work its actor
/// published as `actor` watches; the actor must understand stall_atom (a
/// training rank's "train-watch" does). Errors as request_corrupt.
caf::error request_stall(node& n, const std::string& peer, const std::string& token, const std::string& actor, bool on,
                         std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Asks node `peer` to drop the next `count` training messages of `type`
/// ("train.act", "train.grad", ...) that reach its mailbox ("train").
/// Errors as request_corrupt (unknown_actor: the node runs no rank).
caf::error request_lose(node& n, const std::string& peer, const std::string& token, const std::string& type, int count,
                        std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace corolla
