// apps/stop_clock.hpp — which rank processes have stayed stopped (state T
// or t: SIGSTOP, a debugger) for a limit, from looks at their states
// (rank_processes::watch takes them every 100 ms). A stopped process
// computes nothing and answers nobody while its peers wait on it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace corolla::app {

class stop_clock {
 public:
  using clock_type = std::chrono::steady_clock;

  explicit stop_clock(double limit_s) : limit_s_(limit_s) {}

  /// The ranks `stopped` at `now` that were stopped at every look for the
  /// limit or longer, with for how long; each rank once. A rank seen
  /// running starts again from zero. A gap of more than a second between
  /// two looks (the watcher was stopped itself: Ctrl-Z stops a whole
  /// process group, and after SIGCONT the ranks may be seen stopped a
  /// moment longer than it) starts every count again.
  std::vector<std::pair<int, double>> look(const std::vector<int>& stopped, clock_type::time_point now) {
    if (last_look_ && now - *last_look_ > std::chrono::seconds(1)) since_.clear();
    last_look_ = now;
    std::map<int, clock_type::time_point> still;
    std::vector<std::pair<int, double>> out;
    for (int r : stopped) {
      const auto it = since_.find(r);
      const auto since = it == since_.end() ? now : it->second;
      still[r] = since;
      const double seconds = std::chrono::duration<double>(now - since).count();
      if (seconds >= limit_s_ && reported_.insert(r).second) out.emplace_back(r, seconds);
    }
    since_ = std::move(still);
    return out;
  }

 private:
  double limit_s_;
  std::optional<clock_type::time_point> last_look_;
  std::map<int, clock_type::time_point> since_;
  std::set<int> reported_;
};

}  // namespace corolla::app
