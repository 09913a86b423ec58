#include "apps/local_swarm.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <regex>
#include <stdexcept>

#include "apps/self_process.hpp"

namespace corolla::app {

local_swarm::~local_swarm() {
  // SIGTERM first (a server says goodbye to its peers), SIGKILL after a
  // grace period; every child is reaped.
  std::vector<pid_t> pids;
  for (const auto& s : servers_) pids.push_back(s.pid);
  terminate_all(pids, std::chrono::seconds(2));
}

const local_swarm::server& local_swarm::start(const std::filesystem::path& model, const std::string& id, int first,
                                              int last, const std::vector<std::string>& extra,
                                              const std::filesystem::path& log, std::chrono::milliseconds timeout) {
  std::vector<std::string> args{"serve",     "--model",   model.string(), "--blocks",
                                std::to_string(first) + ":" + std::to_string(last), "--node-id", id,
                                "--listen",  "tcp://127.0.0.1:0"};
  // The caller hands out the endpoints: no DHT unless it asks for one.
  if (std::find(extra.begin(), extra.end(), "--initial-peers") == extra.end()) args.push_back("--no-dht");
  args.insert(args.end(), extra.begin(), extra.end());
  // A server behind NAT (--no-listen) names its relay's endpoint instead.
  return spawn({id, "", first, last, -1}, args, log,
               R"(corolla serve \S+ blocks \[\d+, \d+\) of \S+ (?:listening on|reached through relay \S+ at) (tcp://\S+))",
               timeout,
               "corolla serve " + id + " (blocks " + std::to_string(first) + ":" + std::to_string(last) + ")");
}

const local_swarm::server& local_swarm::start_relay(const std::string& id, const std::vector<std::string>& extra,
                                                    const std::filesystem::path& log,
                                                    std::chrono::milliseconds timeout) {
  std::vector<std::string> args{"node", "--relay-service", "--node-id", id, "--listen", "tcp://127.0.0.1:0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return spawn({id, "", 0, 0, -1}, args, log, R"(corolla node \S+ listening on (tcp://\S+))", timeout,
               "corolla node --relay-service " + id);
}

const local_swarm::server& local_swarm::spawn(server s, const std::vector<std::string>& args,
                                              const std::filesystem::path& log, const std::string& pattern,
                                              std::chrono::milliseconds timeout, const std::string& what) {
  const std::string err_path = log.empty() ? std::string("/dev/null") : log.string();
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  try {
    s.pid = spawn_self(args, out[1], err_path);
  } catch (...) {
    ::close(out[0]);
    ::close(out[1]);
    throw;
  }
  ::close(out[1]);
  servers_.push_back(s);

  // The readiness line, within the timeout.
  const std::regex ready(pattern);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::smatch m;
  bool found = false;
  while (!found) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{out[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[1024];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;  // the process exited
    text.append(buf, static_cast<std::size_t>(n));
    found = std::regex_search(text, m, ready);
  }
  ::close(out[0]);
  if (!found)
    throw std::runtime_error(what + " did not report that it listens" +
                             (text.empty() ? std::string() : ": it printed '" + text + "'") +
                             (log.empty() ? std::string() : "; see " + log.string()));
  servers_.back().endpoint = m[1].str();
  return servers_.back();
}

void local_swarm::signal(const std::string& id, int sig) {
  for (const auto& s : servers_)
    if (s.id == id && s.pid > 0) ::kill(s.pid, sig);
}

std::vector<std::string> local_swarm::endpoints() const {
  std::vector<std::string> out;
  for (const auto& s : servers_) out.push_back(s.endpoint);
  return out;
}

}  // namespace corolla::app
