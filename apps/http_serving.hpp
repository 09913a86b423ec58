// apps/http_serving.hpp — how a command that serves HTTP (`corolla api`,
// `corolla dashboard`) runs until SIGINT or SIGTERM and then stops within a
// bound.
#pragma once

#include <chrono>
#include <csignal>
#include <functional>

namespace corolla::app {

/// Runs `run` (a server's blocking loop) on a thread until SIGINT or
/// SIGTERM (`stop_signals`, blocked by block_stop_signals), then calls
/// `stop` and waits for `run` to return, at most `grace`. Past it (a
/// connection still open: a long generation, or a slow client within its
/// request's read limit, api/http_server.hpp), it says so on
/// stderr and ends the process at once with status 0 (with a `grace` of 0
/// at once, saying nothing). `what` names the command ("api",
/// "dashboard").
void serve_until_stop_signal(const char* what, const sigset_t& stop_signals, std::chrono::seconds grace,
                             const std::function<void()>& run, const std::function<void()>& stop);

}  // namespace corolla::app
