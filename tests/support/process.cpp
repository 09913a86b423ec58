#include "tests/support/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace corolla::testing {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

/// Closes a file descriptor when it goes out of scope.
struct fd_closer {
  int fd = -1;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<std::string> process_result::err_lines() const { return split_lines(err); }
std::vector<std::string> process_result::out_lines() const { return split_lines(out); }

process_result run_process(const std::filesystem::path& program,
                           const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  }
  std::vector<std::string> argv_storage;
  argv_storage.push_back(program.string());
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    // Child: only async-signal-safe calls from here on.
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execv(argv[0], argv.data());
    const char msg[] = "run_process: exec failed\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  fd_closer out_fd{out_pipe[0]}, err_fd{err_pipe[0]};

  process_result r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool out_open = true, err_open = true;
  char buf[65536];
  while (out_open || err_open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fds[2];
    int n = 0;
    if (out_open) fds[n++] = {out_fd.fd, POLLIN, 0};
    if (err_open) fds[n++] = {err_fd.fd, POLLIN, 0};
    const int ready = ::poll(fds, static_cast<nfds_t>(n), static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) {
      ::kill(pid, SIGKILL);
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const bool is_out = fds[i].fd == out_fd.fd;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (is_out ? r.out : r.err).append(buf, static_cast<std::size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        (is_out ? out_open : err_open) = false;
      }
    }
  }
  // The pipes closing does not mean the process has exited: wait for that
  // too, still bounded by the deadline.
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, r.timed_out ? 0 : WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    if (done == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        r.timed_out = true;
        // SIGTERM first (a launcher ends its ranks on it), SIGKILL after 2 s.
        ::kill(pid, SIGTERM);
        pid_t t = 0;
        for (int i = 0; i < 200 && ((t = ::waitpid(pid, &status, WNOHANG)) == 0 || (t < 0 && errno == EINTR)); ++i)
          ::usleep(10000);
        if (t == pid) break;
        ::kill(pid, SIGKILL);
      } else {
        ::usleep(2000);
      }
    }
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  return r;
}

process_result run_corolla(const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout) {
  return run_process(COROLLA_BINARY, args, timeout);
}

}  // namespace corolla::testing
