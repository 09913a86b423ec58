#include "apps/self_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace corolla::app {

namespace {

/// This program's binary and `args` as an argv (argv[0] "corolla"),
/// resolved before forking (the child's /proc/self is itself).
struct self_command {
  std::string binary;
  std::vector<std::string> strings{"corolla"};
  std::vector<char*> argv;

  explicit self_command(const std::vector<std::string>& args) {
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) throw std::runtime_error("cannot find this program's binary: " + std::string(std::strerror(errno)));
    binary.assign(self, static_cast<std::size_t>(len));
    strings.insert(strings.end(), args.begin(), args.end());
    for (auto& a : strings) argv.push_back(a.data());
    argv.push_back(nullptr);
  }
};

// The processes a stop signal ends (end_on_stop_signals): a fixed table
// of atomics, read in the signal handler.
constexpr std::size_t max_guarded = 1024;
std::array<std::atomic<pid_t>, max_guarded> guarded{};

static_assert(std::atomic<pid_t>::is_always_lock_free, "the stop-signal handler reads the table lock-free");

// The file a stop signal removes: written only while `removable` is false.
char removable_path[4096];
std::atomic<bool> removable{false};

// The directory trees a stop signal removes: a fixed table, each slot
// claimed (taken) before its path is written and armed after.
struct removable_tree {
  char path[4096];
  std::atomic<bool> taken{false};
  std::atomic<bool> armed{false};
};
constexpr std::size_t max_trees = 8;
std::array<removable_tree, max_trees> trees;

/// Removes `name` in directory `parent` with everything in it, with
/// async-signal-safe calls only (a stop signal's handler runs it): no
/// allocation, a 4 KiB buffer per level, at most 16 levels. A pass that
/// leaves entries (the directory changed while read) is repeated twice.
void remove_tree_at(int parent, const char* name, int depth) {
  if (::unlinkat(parent, name, 0) == 0 || (errno != EISDIR && errno != EPERM) || depth > 16) return;
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  for (int pass = 0; pass < 3; ++pass) {
    alignas(8) char buf[4096];
    ssize_t n = 0;
    while ((n = ::getdents64(fd, buf, sizeof buf)) > 0)
      for (ssize_t at = 0; at < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + at);
        at += d->d_reclen;
        if (std::strcmp(d->d_name, ".") != 0 && std::strcmp(d->d_name, "..") != 0) remove_tree_at(fd, d->d_name, depth + 1);
      }
    if (::unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) break;
    ::lseek(fd, 0, SEEK_SET);
  }
  ::close(fd);
}

void end_guarded(int sig) {
  for (auto& p : guarded)
    if (const pid_t pid = p.load(); pid > 0) ::kill(pid, SIGKILL);
  if (removable.load()) ::unlink(removable_path);
  for (removable_tree& t : trees)
    if (t.armed.load()) remove_tree_at(AT_FDCWD, t.path, 0);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

}  // namespace

pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd, const std::string& err_path,
                 bool die_with_parent) {
  self_command cmd(args);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
    }
    if (stdout_fd >= 0) ::dup2(stdout_fd, STDOUT_FILENO);
    if (!err_path.empty()) {
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) ::dup2(err, STDERR_FILENO);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    }
    ::execv(cmd.binary.c_str(), cmd.argv.data());
    ::_exit(127);
  }
  return pid;
}

pid_t spawn_self_detached(const std::vector<std::string>& args, const std::string& cwd) {
  self_command cmd(args);
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  const pid_t middle = ::fork();
  if (middle < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  }
  if (middle == 0) {
    ::close(fds[0]);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      ::prctl(PR_SET_PDEATHSIG, 0);
      // Forked from whichever thread asked (an actor's): the new program
      // starts with no signal blocked (SIGTERM must reach its handler).
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      // Only async-signal-safe calls here (forked from a threaded process):
      // a failure says what failed on stderr with write(2).
      auto fail = [](const char* what, int code) {
        static const char head[] = "corolla: cannot start a detached process: ";
        ssize_t ignored = ::write(STDERR_FILENO, head, sizeof head - 1);
        ignored = ::write(STDERR_FILENO, what, std::strlen(what));
        (void)ignored;
        ::_exit(code);
      };
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) fail("its working directory is gone (chdir failed)\n", 126);
      ::execv(cmd.binary.c_str(), cmd.argv.data());
      fail("exec failed (this program's binary was replaced or removed?)\n", 127);
    }
    // Its id to the caller; then this middle process ends, and the new
    // one is nobody's child here.
    ssize_t ignored = ::write(fds[1], &pid, sizeof pid);
    (void)ignored;
    ::_exit(pid > 0 ? 0 : 1);
  }
  ::close(fds[1]);
  pid_t pid = -1;
  const ssize_t got = ::read(fds[0], &pid, sizeof pid);
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(middle, &st, 0) < 0 && errno == EINTR) {
  }
  if (got != static_cast<ssize_t>(sizeof pid) || pid <= 0) throw std::runtime_error("could not start a detached process");
  return pid;
}

process_stat read_process_stat(pid_t pid) {
  process_stat out;
  if (pid <= 0) return out;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return out;
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses; from
  // STATE (field 3) on, starttime is field 22.
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return out;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  rest >> field;
  out.state = field.empty() ? '\0' : field[0];
  for (int i = 4; i < 22 && (rest >> field); ++i) {
  }
  rest >> out.started;
  return out;
}

bool process_alive(pid_t pid) { return read_process_stat(pid).alive(); }

std::uint64_t process_start_time(pid_t pid) { return read_process_stat(pid).started; }

void end_on_stop_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // nohup, a background job
    struct sigaction now {};
    now.sa_handler = end_guarded;
    // One stop at a time: a second signal waits for the first's handler
    // (which may be removing a directory tree) instead of nesting in it.
    ::sigemptyset(&now.sa_mask);
    for (int other : {SIGINT, SIGTERM, SIGHUP}) ::sigaddset(&now.sa_mask, other);
    now.sa_flags = SA_RESTART;
    ::sigaction(sig, &now, nullptr);
  }
}

void end_on_stop_signal(pid_t pid) {
  if (pid <= 0) return;
  for (auto& p : guarded) {
    pid_t empty = 0;
    if (p.compare_exchange_strong(empty, pid)) return;
  }
}

void remove_on_stop_signal(const std::string& path) {
  removable = false;
  if (path.empty() || path.size() >= sizeof removable_path) return;
  std::memcpy(removable_path, path.c_str(), path.size() + 1);
  removable = true;
}

void remove_tree_on_stop_signal(const std::string& path) {
  if (path.empty() || path.size() >= sizeof trees[0].path) return;
  for (removable_tree& t : trees) {
    bool free = false;
    if (!t.taken.compare_exchange_strong(free, true)) continue;
    std::memcpy(t.path, path.c_str(), path.size() + 1);
    t.armed = true;
    return;
  }
}

void forget_tree_on_stop_signal(const std::string& path) {
  for (removable_tree& t : trees)
    if (t.armed.load() && path == t.path) {
      t.armed = false;
      t.taken = false;
      return;
    }
}

void forget_on_stop_signal(pid_t pid) {
  if (pid <= 0) return;
  for (auto& p : guarded) {
    pid_t x = pid;
    p.compare_exchange_strong(x, 0);
  }
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
    // Not this process's child (a process adopted from another launcher):
    // gone once it has ended.
    while (r < 0 && errno == ECHILD && process_alive(p) && std::chrono::steady_clock::now() < deadline) {
      ::usleep(5000);
      r = ::waitpid(p, &st, WNOHANG);
    }
    if (r == p || (r < 0 && !process_alive(p))) {
      forget_on_stop_signal(p);
      p = -1;  // reaped, or ended and not (or no longer) our child
    } else
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
    pid_t r;
    while ((r = ::waitpid(p, &st, 0)) < 0 && errno == EINTR) {
    }
    // Not our child: it ends at once (its parent reaps it).
    for (int i = 0; r < 0 && i < 400 && process_alive(p); ++i) ::usleep(5000);
    forget_on_stop_signal(p);
    p = -1;
  }
}

std::vector<process_command> children_of(pid_t parent) {
  std::vector<process_command> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream cmd(e.path() / "cmdline", std::ios::binary);
    process_command c;
    c.pid = static_cast<pid_t>(std::stol(name));
    for (std::string a; std::getline(cmd, a, '\0');) c.args.push_back(a);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::pair<int, pid_t>> rank_processes_of(pid_t parent) {
  std::vector<std::pair<int, pid_t>> out;
  for (const process_command& c : children_of(parent))
    for (std::size_t i = 0; i + 1 < c.args.size(); ++i)
      if (c.args[i] == "--rank") out.emplace_back(std::stoi(c.args[i + 1]), c.pid);
  return out;
}

}  // namespace corolla::app
