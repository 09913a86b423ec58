// apps/local_swarm.hpp — `corolla serve` (and relay `corolla node`)
// processes of this very binary on 127.0.0.1, for the demo, `corolla bench
// swarm` and `corolla faultlab`: started with a bounded
// wait for their readiness lines, killed and reaped when the owner goes (also
// on an exception), and killed by the kernel if this process dies first.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace corolla::app {

class local_swarm {
 public:
  /// One running server.
  struct server {
    std::string id, endpoint;
    int first = 0, last = 0;
    pid_t pid = -1;
  };

  local_swarm() = default;
  ~local_swarm();
  local_swarm(const local_swarm&) = delete;
  local_swarm& operator=(const local_swarm&) = delete;

  /// Starts `corolla serve --model DIR --blocks A:B --node-id ID` listening
  /// on a free loopback port (with --no-dht unless `extra` has
  /// --initial-peers), plus `extra` flags; its stderr goes to `log`
  /// ("" = /dev/null). Throws std::runtime_error when it does not print its
  /// readiness line within `timeout` (naming what it printed).
  const server& start(const std::filesystem::path& model, const std::string& id, int first, int last,
                      const std::vector<std::string>& extra = {}, const std::filesystem::path& log = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  /// Starts `corolla node --relay-service --node-id ID` listening on a free
  /// loopback port, plus `extra`, as a relay for servers behind NAT; listed
  /// and signalled with the servers (blocks [0, 0)). Throws as start().
  const server& start_relay(const std::string& id, const std::vector<std::string>& extra = {},
                            const std::filesystem::path& log = {},
                            std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// Sends `sig` to server `id` (SIGKILL, SIGSTOP, SIGCONT, ...).
  void signal(const std::string& id, int sig);
  /// Endpoints of every server started, in start order.
  std::vector<std::string> endpoints() const;
  const std::vector<server>& servers() const { return servers_; }

 private:
  /// Spawns this binary with `args` (stderr to `log`) as `s`, and waits for
  /// the line `ready` matches on its stdout: its group 1 is the endpoint.
  const server& spawn(server s, const std::vector<std::string>& args, const std::filesystem::path& log,
                      const std::string& pattern, std::chrono::milliseconds timeout, const std::string& what);

  std::vector<server> servers_;
};

}  // namespace corolla::app
