// actors/echo_actor.hpp — the "echo" actor every node publishes: it answers a
// remote_message of type "echo" with the same body and tensors (corolla
// ping, liveness checks, tests).
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace corolla {

/// Name every node publishes its echo actor under.
inline constexpr const char* echo_actor_name = "echo";

/// Spawns an echo actor: (remote_message of type "echo") -> the same body
/// and tensors, type "echo"; any other type -> errc::bad_message.
caf::actor spawn_echo_actor(caf::actor_system& system);

}  // namespace corolla
