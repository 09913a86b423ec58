#include "apps/self_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace corolla::app {

pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd, const std::string& err_path) {
  // Resolve our own binary before forking (the child's /proc/self is itself).
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) throw std::runtime_error("cannot find this program's binary: " + std::string(std::strerror(errno)));
  self[len] = '\0';
  std::vector<std::string> argv_strings{"corolla"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    if (stdout_fd >= 0) ::dup2(stdout_fd, STDOUT_FILENO);
    if (!err_path.empty()) {
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) ::dup2(err, STDERR_FILENO);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    }
    ::execv(self, argv.data());
    ::_exit(127);
  }
  return pid;
}

bool reap_all(std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool all = true;
  for (pid_t& p : pids) {
    if (p <= 0) continue;
    int st = 0;
    pid_t r = 0;
    while (((r = ::waitpid(p, &st, WNOHANG)) == 0 || (r < 0 && errno == EINTR)) &&
           std::chrono::steady_clock::now() < deadline)
      ::usleep(5000);
    if (r == p || r < 0)
      p = -1;  // reaped, or not (or no longer) our child
    else
      all = false;
  }
  return all;
}

void terminate_all(std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  for (pid_t p : pids)
    if (p > 0) ::kill(p, SIGTERM);
  if (reap_all(pids, grace)) return;
  for (pid_t& p : pids) {
    if (p <= 0) continue;
    ::kill(p, SIGKILL);
    int st = 0;
    while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    p = -1;
  }
}

}  // namespace corolla::app
