// apps/serve_drain.cpp — see serve_drain.hpp.
#include "apps/serve_drain.hpp"

#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/span_server.hpp"
#include "apps/node_flags.hpp"

namespace corolla::app {

void drain(node& n, const caf::actor& server, const sigset_t& stop_signals, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool announced = false;
  for (;;) {
    auto open = drain_span_server(n.system(), server);
    if (!open) {
      spdlog::warn("serve: draining: {}", error_message(open.error()));
      return;
    }
    if (*open == 0) {
      if (announced) spdlog::info("serve: every session has ended");
      return;
    }
    if (!announced) {
      spdlog::info("serve: draining {} open session(s) for at most {} s (signal again to stop now)", *open,
                   timeout.count());
      announced = true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::warn("serve: stopping with {} session(s) still open after {} s of draining", *open, timeout.count());
      return;
    }
    if (const char* again = wait_for_stop_signal(stop_signals, std::chrono::milliseconds(100))) {
      spdlog::warn("serve: {} while draining: stopping with {} session(s) open", again, *open);
      return;
    }
  }
}

}  // namespace corolla::app
