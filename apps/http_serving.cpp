#include "apps/http_serving.hpp"

#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include <spdlog/spdlog.h>

#include "apps/node_flags.hpp"

namespace corolla::app {

void serve_until_stop_signal(const char* what, const sigset_t& stop_signals, std::chrono::seconds grace,
                             const std::function<void()>& run, const std::function<void()>& stop) {
  std::promise<void> ended;
  std::future<void> done = ended.get_future();
  std::thread serving([&] {
    run();
    ended.set_value();
  });
  const char* sig = wait_for_stop_signal(stop_signals);
  spdlog::info("{}: {}: stopping", what, sig);
  stop();
  if (grace.count() == 0) {  // at once, whatever is open
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(0);
  }
  if (done.wait_for(grace) != std::future_status::ready) {
    // The serving thread and whatever its connections use are left as they
    // are: no destructor runs.
    std::fprintf(stderr, "corolla %s: connections still open %lld s after %s; exiting without them\n", what,
                 static_cast<long long>(grace.count()), sig);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(0);
  }
  serving.join();
}

}  // namespace corolla::app
