// apps/rank_processes.cpp — see rank_processes.hpp.
#include "apps/rank_processes.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <regex>
#include <thread>

#include "actors/train_comm.hpp"
#include "apps/self_process.hpp"

namespace corolla::app {

namespace {

std::string how_it_ended(int st) {
  return WIFEXITED(st) ? "exit status " + std::to_string(WEXITSTATUS(st)) : "signal " + std::to_string(WTERMSIG(st));
}

}  // namespace

void rank_processes::start(const std::vector<std::string>& args, bool die_with_launcher) {
  const pid_t pid = spawn_self(args, -1, {}, die_with_launcher);
  pids_.push_back(pid);
  end_on_stop_signal(pid);
}

void rank_processes::adopt(pid_t pid) {
  pids_.push_back(pid);
  end_on_stop_signal(pid);
}

void rank_processes::watch(const std::atomic<bool>& stop, const std::function<void(int, const std::string&)>& ended,
                           double stopped_limit_s, const std::function<void(int, double)>& stopped) {
  stop_clock stops(stopped_limit_s);
  auto next_look = stop_clock::clock_type::now();
  while (!stop) {
    for (const auto& [rank, how] : reap_now()) ended(rank, how);
    if (std::none_of(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; })) return;
    // /proc is read every 100 ms, not at every 20 ms reap.
    if (const auto now = stop_clock::clock_type::now(); stopped_limit_s > 0 && now >= next_look) {
      for (const auto& [rank, seconds] : stops.look(this->stopped(), now)) stopped(rank, seconds);
      next_look = now + std::chrono::milliseconds(100);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::pair<int, std::string>> rank_processes::reap_now() {
  std::vector<std::pair<int, std::string>> out;
  for (std::size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] <= 0) continue;
    int st = 0;
    const pid_t r = ::waitpid(pids_[i], &st, WNOHANG);
    if (r < 0 && errno == ECHILD) {
      // Adopted from a launcher this one took over from: not this
      // process's child, so how it ended is unknown; taken for killed.
      if (process_alive(pids_[i])) continue;
      forget_on_stop_signal(pids_[i]);
      pids_[i] = -1;
      out.emplace_back(static_cast<int>(i), "signal (not this launcher's child: how it ended is unknown)");
      continue;
    }
    if (r != pids_[i]) continue;
    forget_on_stop_signal(pids_[i]);
    pids_[i] = -1;
    out.emplace_back(static_cast<int>(i), how_it_ended(st));
  }
  return out;
}

std::vector<int> rank_processes::stopped() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] <= 0) continue;
    if (const char state = read_process_stat(pids_[i]).state; state == 'T' || state == 't')
      out.push_back(static_cast<int>(i));
  }
  return out;
}

void rank_processes::wait_all(std::chrono::milliseconds timeout) { reap_all(pids_, timeout); }

void rank_processes::stop() { terminate_all(pids_, std::chrono::seconds(2)); }

double stopped_limit_s(double hang_s) { return hang_s > 0 ? std::min(hang_s, 2.0) : 0.0; }

std::vector<int> lost_ranks(rank_processes& ranks, const std::set<int>& signalled, int world,
                            const std::exception_ptr& failure) {
  std::set<int> gone(signalled.begin(), signalled.end());
  if (failure) try {
      std::rethrow_exception(failure);
    } catch (const train_stall& s) {
      for (int r : s.blamed())
        if (r >= 0 && r < world) gone.insert(r);
      return {gone.begin(), gone.end()};
    } catch (...) {
    }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (;;) {
    for (const auto& [rank, how] : ranks.reap_now())
      if (how.rfind("signal", 0) == 0) gone.insert(rank);
    const std::vector<int> stopped = ranks.stopped();
    gone.insert(stopped.begin(), stopped.end());
    if (!gone.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (gone.empty() && failure) {
    std::string what;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    static const std::regex named(R"(\brank (\d+) \()");
    int last = -1;
    for (auto it = std::sregex_iterator(what.begin(), what.end(), named); it != std::sregex_iterator(); ++it)
      if ((*it)[1].length() <= 6) last = std::stoi((*it)[1]);  // a rank number, not a stray long one
    if (last >= 0 && last < world) gone.insert(last);
  }
  return {gone.begin(), gone.end()};
}

}  // namespace corolla::app
