// apps/self_process.hpp — child processes of this very binary (local rank
// processes of `corolla train`, local `corolla serve` servers of the demo
// and `corolla bench swarm`): started without a shell, killed by the
// kernel if this process dies first, and terminated and reaped together.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace corolla::app {

/// Forks and executes this program's binary with `args` (argv[0] is
/// "corolla"). The child gets SIGKILL when this process dies. `stdout_fd`
/// (when >= 0) becomes its stdout; `err_path` (when not empty) its stderr,
/// and stdin is then /dev/null. Throws std::runtime_error when it cannot.
pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd = -1, const std::string& err_path = {});

/// Reaps the children among `pids` (> 0) that exit within `timeout`,
/// setting each reaped one to -1; sends no signal. Returns whether all are
/// gone.
bool reap_all(std::vector<pid_t>& pids, std::chrono::milliseconds timeout);

/// SIGTERM to every pid > 0, SIGKILL to those still running after `grace`;
/// all are reaped and set to -1.
void terminate_all(std::vector<pid_t>& pids, std::chrono::milliseconds grace);

}  // namespace corolla::app
