// actors/remote_proxy.hpp — the local stand-in for an actor on another node
// (internal; node::remote_actor hands these out).
//
// A proxy accepts remote_message and delegates it, unchanged, to the link
// that currently reaches its peer (looked up per message, so a reconnected
// or replaced link is picked up). Delegation keeps the original sender and
// request id: the link answers the requester directly, and a request that
// gets no answer runs into the requester's own CAF timeout.
#pragma once

#include <memory>
#include <string>

#include <caf/actor.hpp>

#include "actors/node_context.hpp"

namespace corolla {

/// Spawns a proxy for actor `name` on node `peer`.
caf::actor spawn_remote_proxy(const std::shared_ptr<node_context>& ctx, std::string peer,
                              std::string name);

}  // namespace corolla
