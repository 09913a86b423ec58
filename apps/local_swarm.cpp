#include "apps/local_swarm.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <regex>
#include <stdexcept>

namespace corolla::app {

local_swarm::~local_swarm() {
  // SIGTERM first (a server says goodbye to its peers), SIGKILL after a
  // grace period; every child is reaped.
  for (auto& s : servers_)
    if (s.pid > 0) ::kill(s.pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& s : servers_) {
    if (s.pid <= 0) continue;
    int st = 0;
    pid_t r = 0;
    while (((r = ::waitpid(s.pid, &st, WNOHANG)) == 0 || (r < 0 && errno == EINTR)) &&
           std::chrono::steady_clock::now() < deadline)
      ::usleep(5000);
    if (r <= 0) {
      ::kill(s.pid, SIGKILL);
      while (::waitpid(s.pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

const local_swarm::server& local_swarm::start(const std::filesystem::path& model, const std::string& id, int first,
                                              int last, const std::vector<std::string>& extra,
                                              const std::filesystem::path& log, std::chrono::milliseconds timeout) {
  std::vector<std::string> args{"/proc/self/exe", "serve",   "--model",  model.string(),
                                "--blocks",       std::to_string(first) + ":" + std::to_string(last),
                                "--node-id",      id,        "--listen", "tcp://127.0.0.1:0"};
  // The caller hands out the endpoints: no DHT unless it asks for one.
  if (std::find(extra.begin(), extra.end(), "--initial-peers") == extra.end()) args.push_back("--no-dht");
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Resolve our own binary before forking (the child's /proc/self is itself).
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) throw std::runtime_error("cannot find this program's binary: " + std::string(std::strerror(errno)));
  self[len] = '\0';
  const std::string err_path = log.empty() ? std::string("/dev/null") : log.string();

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(out[1], STDOUT_FILENO);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execv(self, argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  servers_.push_back({id, "", first, last, pid});

  // The readiness line, within the timeout.
  static const std::regex ready(R"(corolla serve \S+ blocks \[\d+, \d+\) of \S+ listening on (tcp://\S+))");
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
    if (n <= 0) break;  // the server exited
    text.append(buf, static_cast<std::size_t>(n));
    found = std::regex_search(text, m, ready);
  }
  ::close(out[0]);
  if (!found)
    throw std::runtime_error("corolla serve " + id + " (blocks " + std::to_string(first) + ":" + std::to_string(last) +
                             ") did not report that it listens" +
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
