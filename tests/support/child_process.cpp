#include "tests/support/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace corolla::testing {

child_process::child_process(const std::filesystem::path& program, std::vector<std::string> args) {
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  err_file_ = std::filesystem::temp_directory_path() /
              ("corolla-child-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()) + ".err");
  const std::string err_path = err_file_.string();
  std::vector<std::string> argv_storage{program.string()};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  if (pid_ == 0) {
    // Child: async-signal-safe calls only.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);  // the test died before prctl
    ::dup2(out_pipe[1], STDOUT_FILENO);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  out_fd_ = out_pipe[0];
}

child_process child_process::corolla(std::vector<std::string> args) {
  return child_process(COROLLA_BINARY, std::move(args));
}

child_process::child_process(child_process&& o) noexcept
    : pid_(o.pid_), out_fd_(o.out_fd_), err_file_(std::move(o.err_file_)), pending_(std::move(o.pending_)),
      lines_(std::move(o.lines_)), status_(o.status_) {
  o.pid_ = -1;
  o.out_fd_ = -1;
  o.err_file_.clear();
}

child_process::~child_process() {
  if (pid_ > 0 && !status_) {
    // SIGTERM first: a launcher whose ranks may outlive it (an elastic
    // job's, apps/launcher_takeover.hpp) ends them on a stop signal, not on
    // SIGKILL.
    ::kill(pid_, SIGTERM);
    int st = 0;
    pid_t r = 0;
    for (int i = 0; i < 300 && ((r = ::waitpid(pid_, &st, WNOHANG)) == 0 || (r < 0 && errno == EINTR)); ++i)
      ::usleep(10000);
    if (r != pid_) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (!err_file_.empty()) {
    std::error_code ec;
    std::filesystem::remove(err_file_, ec);
  }
}

std::optional<std::smatch> child_process::wait_line(const std::regex& pattern, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::size_t checked = 0;
  for (;;) {
    for (; checked < lines_.size(); ++checked) {
      std::smatch m;
      if (std::regex_search(lines_[checked], m, pattern)) return m;
    }
    if (out_fd_ < 0) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{out_fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n <= 0) {
      ::close(out_fd_);
      out_fd_ = -1;
      if (!pending_.empty()) lines_.push_back(std::move(pending_)), pending_.clear();
      continue;
    }
    pending_.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending_.find('\n')) != std::string::npos) {
      lines_.push_back(pending_.substr(0, nl));
      pending_.erase(0, nl + 1);
    }
  }
}

std::string child_process::err() const {
  std::ifstream in(err_file_);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

namespace {
/// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie),
/// or 0 when the process is gone.
char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto paren = text.rfind(')');  // the command name may hold spaces
  return paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : 0;
}
}  // namespace

void child_process::signal(int sig) {
  if (pid_ <= 0 || status_) return;
  ::kill(pid_, sig);
  if (sig != SIGKILL && sig != SIGSTOP) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    const char st = process_state(pid_);
    if (st == 0 || st == 'Z' || st == 'X' || (sig == SIGSTOP && st == 'T')) return;
    if (std::chrono::steady_clock::now() > deadline) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::optional<int> child_process::wait(std::chrono::milliseconds timeout) {
  if (status_ || pid_ <= 0) return status_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace corolla::testing
