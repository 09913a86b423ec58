// apps/serve_drain.hpp — how `corolla serve` stops on SIGINT or SIGTERM:
// it drains first (new sessions refused, open ones go on).
#pragma once

#include <chrono>
#include <csignal>

#include <caf/actor.hpp>

namespace corolla {
class node;
}

namespace corolla::app {

/// A graceful shutdown: new sessions are refused while the open ones go on,
/// until none is left, `timeout` has passed, or another stop signal comes.
void drain(node& n, const caf::actor& server, const sigset_t& stop_signals, std::chrono::seconds timeout);

}  // namespace corolla::app
