// apps/launcher_takeover.cpp — see launcher_takeover.hpp.
#include "apps/launcher_takeover.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/capnp_body.hpp"
#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "apps/self_process.hpp"
#include "apps/train_job_file.hpp"
#include "model/whole_file.hpp"
#include "net/wire.capnp.h"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using tick_atom = caf::atom_constant<caf::atom("succtick")>;
using quick_atom = caf::atom_constant<caf::atom("succquick")>;

constexpr std::size_t max_job_bytes = 256 << 10;
constexpr std::size_t max_ledger_bytes = 1 << 20;
constexpr unsigned max_args = 256;
constexpr unsigned max_processes = 4096;
/// How often a successor looks whether the launcher is still there.
constexpr auto look_every = std::chrono::milliseconds(100);
/// A process whose launcher is gone and that no new launcher tells
/// otherwise for this long ends itself.
constexpr auto orphan_limit = std::chrono::seconds(60);

/// This process's command line, without argv[0] and without any
/// "--take-over FILE" (the next takeover writes its own file).
std::vector<std::string> own_args() {
  const std::string all = read_whole_file("/proc/self/cmdline");
  std::vector<std::string> args;
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (!args.empty()) args.erase(args.begin());
  for (std::size_t i = 0; i < args.size();) {
    if (args[i] == "--take-over" && i + 1 < args.size())
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    else if (args[i].rfind("--take-over=", 0) == 0)
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
    else
      ++i;
  }
  return args;
}

constexpr const char* successor_ask_type = "train.successor?";

/// Compares without an early exit (the time says nothing about the token).
bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

struct successor_state {
  node* n = nullptr;
  std::string token;
  std::optional<takeover_state> latest;
  int steps = 0;                 ///< of the latest state's job
  pid_t launcher = 0;            ///< the job file's, until a state names one
  pid_t started_for = 0;         ///< the launcher this process already replaced
  pid_t started = 0;             ///< the launcher it started then
  std::string watched_node;      ///< the launcher node whose link it monitors
  std::optional<clock_type::time_point> gone_since;
};

/// Writes `s` to a private file for the new launcher; its path.
std::string write_state_file(const takeover_state& s) {
  std::string name = (fs::temp_directory_path() / "corolla-takeover-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw std::runtime_error(std::string("cannot create a takeover file: ") + std::strerror(errno));
  const remote_message m = takeover_message(s);
  const bool ok = ::write(fd, m.body.data(), m.body.size()) == static_cast<ssize_t>(m.body.size());
  ::close(fd);
  if (!ok) {
    std::error_code ec;
    fs::remove(name, ec);
    throw std::runtime_error("cannot write " + name);
  }
  return name;
}

/// What /proc says of `p`'s pid, when that pid is still `p` (not reused).
process_stat stat_of(const takeover_process& p) {
  const process_stat s = read_process_stat(p.pid);
  return p.started == 0 || s.started == p.started ? s : process_stat{};
}

/// Whether this process is the first of `s`'s processes still running.
bool elected(const takeover_state& s) {
  for (const takeover_process& p : s.processes)
    if (p.running()) return p.pid == ::getpid();
  return false;
}

/// Starts a new launcher from st.latest, unless another process of this
/// machine started one for the same dead launcher (the lock file).
void start_launcher(successor_state& st) {
  const std::string lock = takeover_lock_path(st.token, st.launcher);
  const int fd = ::open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      st.started_for = st.launcher;  // another one did
      spdlog::info("the launcher (pid {}) is gone; another process started its successor", st.launcher);
    } else {
      spdlog::error("the launcher (pid {}) is gone, and {} cannot be created: {}", st.launcher, lock,
                    std::strerror(errno));
    }
    return;
  }
  ::close(fd);
  std::string file;
  std::error_code ec;
  try {
    std::vector<std::string> args = st.latest->args;
    file = write_state_file(*st.latest);
    args.insert(args.end(), {"--take-over", file});
    const pid_t pid = spawn_self_detached(args, st.latest->cwd);
    st.started_for = st.launcher;
    st.started = pid;
    spdlog::warn("the launcher (pid {}) is gone after step {}: this process (pid {}) started a new one (pid {}) "
                 "to carry the job on",
                 st.launcher, st.latest->printed, ::getpid(), pid);
  } catch (const std::exception& e) {
    // Tried again at the next look.
    if (!file.empty()) fs::remove(file, ec);
    fs::remove(lock, ec);
    spdlog::error("the launcher (pid {}) is gone, and a new one could not be started: {}", st.launcher, e.what());
  }
}

void look(successor_state& st) {
  if (process_alive(st.launcher)) {
    st.gone_since.reset();
    return;
  }
  if (!st.latest) {
    // It never told this process the job's state: no launcher can find it.
    spdlog::error("the launcher (pid {}) is gone before it told this process the job's state: ending", st.launcher);
    std::_Exit(1);
  }
  if (st.started > 0 && st.started_for == st.launcher) {
    if (process_alive(st.started)) {
      st.gone_since.reset();  // the launcher it started is on its way
      return;
    }
    // The launcher this process started ended before it took over (its
    // error is on stderr): the job cannot go on; nobody waits a minute.
    spdlog::error("the launcher started to carry the job on (pid {}) ended before it took over: ending the job's "
                  "processes", st.started);
    for (const takeover_process& p : st.latest->processes)
      if (p.pid != ::getpid() && p.alive()) ::kill(p.pid, SIGKILL);
    std::_Exit(1);
  }
  const auto now = clock_type::now();
  if (!st.gone_since) st.gone_since = now;
  if (st.started_for != st.launcher && st.latest->printed < st.steps && elected(*st.latest)) start_launcher(st);
  if (now - *st.gone_since > orphan_limit) {
    spdlog::error("the launcher (pid {}) is gone and no launcher took this process over within {} s: ending",
                  st.launcher, std::chrono::duration_cast<std::chrono::seconds>(orphan_limit).count());
    std::_Exit(1);
  }
}

caf::behavior successor_actor(caf::event_based_actor* self, std::shared_ptr<successor_state> st) {
  self->delayed_send(self, look_every, tick_atom::value);
  return {
      [=](remote_message& m) -> caf::result<remote_message> {
        if (m.type == successor_ask_type) {
          auto token = capnp_body::decode<wire::TrainTakeoverAsk>(
              m.body, "TrainTakeoverAsk", [](wire::TrainTakeoverAsk::Reader r) { return capnp_body::text(r.getToken(), "token", 128); });
          if (!token) return token.error();
          if (!same_token(*token, st->token)) return make_error(errc::auth_refused, "not this job's launcher");
          if (!st->latest) return make_error(errc::unknown_actor, "this process keeps no state of the launcher");
          return takeover_message(*st->latest);
        }
        if (m.type != successor_type)
          return make_error(errc::invalid_argument, "'" + m.type + "' is not " + successor_type);
        auto s = decode_takeover(m);
        if (!s) return s.error();
        if (!same_token(s->token, st->token)) return make_error(errc::auth_refused, "not this job's launcher");
        int steps = 0;
        try {
          steps = job_from_json_text(s->job, "job description of train.successor").steps;
        } catch (const std::exception& e) {
          return make_error(errc::bad_message, e.what());
        }
        st->steps = steps;
        st->launcher = s->launcher;
        // The launcher's link going down is the first sign of its death
        // (a dead process's connections drop at once): look then.
        if (!s->launcher_node.empty() && s->launcher_node != st->watched_node) {
          if (!st->watched_node.empty()) st->n->demonitor_peer(st->watched_node, self);
          st->n->monitor_peer(s->launcher_node, self);
          st->watched_node = s->launcher_node;
        }
        st->latest = std::move(*s);
        st->gone_since.reset();
        return remote_message{};
      },
      [=](tick_atom) {
        look(*st);
        self->delayed_send(self, look_every, tick_atom::value);
      },
      [=](const peer_down& d) {
        if (d.peer != st->watched_node) return;
        // Its process may take a moment more to be gone from /proc.
        look(*st);
        for (int ms : {5, 20, 50}) self->delayed_send(self, std::chrono::milliseconds(ms), quick_atom::value);
      },
      [=](const peer_up&) {},
      [=](quick_atom) { look(*st); },
  };
}

}  // namespace

remote_message takeover_message(const takeover_state& s) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainTakeover>();
  r.setToken(s.token);
  r.setLauncher(static_cast<std::int32_t>(s.launcher));
  r.setLauncherNode(s.launcher_node);
  r.setCwd(s.cwd);
  auto args = r.initArgs(static_cast<unsigned>(s.args.size()));
  for (unsigned i = 0; i < s.args.size(); ++i) args.set(i, s.args[i]);
  r.setJob(s.job);
  r.setJobFile(s.job_file);
  r.setRun(s.run);
  r.setPrinted(s.printed);
  auto ps = r.initProcesses(static_cast<unsigned>(s.processes.size()));
  for (unsigned i = 0; i < s.processes.size(); ++i) {
    ps[i].setRank(s.processes[i].rank);
    ps[i].setPid(static_cast<std::int32_t>(s.processes[i].pid));
    ps[i].setNodeId(s.processes[i].node_id);
    ps[i].setEndpoint(s.processes[i].endpoint);
    ps[i].setStarted(s.processes[i].started);
  }
  r.setLedger(s.ledger.dump());
  remote_message m;
  m.type = successor_type;
  m.body = capnp_body::flat(b);
  return m;
}

caf::expected<takeover_state> decode_takeover(const remote_message& m) {
  return capnp_body::decode<wire::TrainTakeover>(m.body, "TrainTakeover", [](wire::TrainTakeover::Reader r) {
    takeover_state s;
    s.token = capnp_body::text(r.getToken(), "token", 128);
    s.launcher = r.getLauncher();
    if (s.launcher <= 0) throw std::invalid_argument("launcher pid " + std::to_string(s.launcher));
    s.launcher_node = capnp_body::text(r.getLauncherNode(), "launcher node");
    s.cwd = capnp_body::text(r.getCwd(), "cwd", 4096);
    auto args = r.getArgs();
    if (args.size() == 0 || args.size() > max_args) throw std::invalid_argument(std::to_string(args.size()) + " arguments");
    for (auto x : args) s.args.push_back(capnp_body::text(x, "argument", 4096));
    // Only an elastic `corolla train` is ever started from a state.
    if (s.args.front() != "train" || std::find(s.args.begin(), s.args.end(), "--elastic") == s.args.end())
      throw std::invalid_argument("the command line is not an elastic corolla train");
    s.job = capnp_body::text(r.getJob(), "job", max_job_bytes);
    s.job_file = capnp_body::text(r.getJobFile(), "job file", 4096);
    s.run = r.getRun();
    s.printed = r.getPrinted();
    auto ps = r.getProcesses();
    if (ps.size() > max_processes) throw std::invalid_argument(std::to_string(ps.size()) + " processes");
    for (auto p : ps) {
      takeover_process x;
      x.rank = p.getRank();
      x.pid = p.getPid();
      if (x.pid <= 0) throw std::invalid_argument("process pid " + std::to_string(x.pid));
      x.node_id = capnp_body::text(p.getNodeId(), "node id");
      x.endpoint = capnp_body::text(p.getEndpoint(), "endpoint");
      x.started = p.getStarted();
      s.processes.push_back(std::move(x));
    }
    const std::string ledger = capnp_body::text(r.getLedger(), "ledger", max_ledger_bytes);
    s.ledger = nlohmann::json::parse(ledger, nullptr, false);
    if (!s.ledger.is_object()) throw std::invalid_argument("the ledger is not a JSON object");
    return s;
  });
}

std::string new_takeover_token() {
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

launcher_replicas::launcher_replicas(std::string token) {
  state_.token = std::move(token);
  state_.launcher = ::getpid();
  std::error_code ec;
  state_.cwd = fs::current_path(ec).string();
  state_.args = own_args();
}

void launcher_replicas::grid(node* n, std::vector<takeover_process> processes, std::string job, std::uint64_t run,
                             bool armed, std::string job_file) {
  std::lock_guard<std::mutex> lock(mutex_);
  node_ = n;
  if (n) state_.launcher_node = n->id();
  state_.processes = armed ? processes : std::vector<takeover_process>{};
  recipients_ = std::move(processes);
  state_.job = std::move(job);
  state_.job_file = std::move(job_file);
  state_.run = run;
  if (node_) send_locked();
}

void launcher_replicas::publish(int printed, nlohmann::json ledger) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.printed = printed;
  state_.ledger = std::move(ledger);
  // A grid nobody may take over was told so at its roster (its new
  // processes keep no state: nothing to tell them at every step).
  if (node_ && !state_.processes.empty()) send_locked();
}

void launcher_replicas::send_locked() {
  const remote_message m = takeover_message(state_);
  // A state naming no process (a grid nobody may take over) needs no answer.
  bool acknowledged = state_.processes.empty();
  for (const takeover_process& p : recipients_) {
    const process_stat stat = stat_of(p);
    if (!stat.alive()) continue;
    if (!acknowledged && stat.running()) {
      // The one a takeover would start from: the step is printed once it
      // knows. Without its answer the next running process is asked.
      auto r = node_->request(p.node_id, successor_name, m, std::chrono::seconds(1));
      if (r) {
        acknowledged = true;
        continue;
      }
      if (!warned_) {
        warned_ = true;
        spdlog::warn("the process at {} does not keep the launcher's state: {}", p.endpoint, error_message(r.error()));
      }
    }
    (void)node_->post(p.node_id, successor_name, m);
  }
}

bool takeover_process::alive() const { return stat_of(*this).alive(); }

bool takeover_process::running() const { return stat_of(*this).running(); }

caf::expected<takeover_state> fetch_takeover_state(node& n, const std::string& node_id, const std::string& token,
                                                   std::chrono::milliseconds timeout) {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::TrainTakeoverAsk>().setToken(token);
  remote_message ask;
  ask.type = successor_ask_type;
  ask.body = capnp_body::flat(b);
  auto r = n.request(node_id, successor_name, std::move(ask), timeout);
  if (!r) return r.error();
  return decode_takeover(*r);
}

takeover_state newest_takeover_state(node& n, takeover_state t) {
  takeover_state best = t;
  for (const takeover_process& p : t.processes) {
    if (!p.alive()) continue;
    connect_options co;
    co.timeout = std::chrono::seconds(5);
    if (!n.peer_is_up(p.node_id)) {
      auto c = n.connect(p.endpoint, co);
      if (!c || *c != p.node_id) continue;
    }
    auto s = fetch_takeover_state(n, p.node_id, t.token, std::chrono::seconds(2));
    if (!s) {
      spdlog::warn("the process at {} does not say what it keeps of the launcher's state: {}", p.endpoint,
                   error_message(s.error()));
      continue;
    }
    if (s->launcher == t.launcher && s->printed > best.printed) best = std::move(*s);
  }
  return best;
}

std::string takeover_lock_path(const std::string& token, pid_t launcher) {
  char name[96];
  std::snprintf(name, sizeof name, "corolla-takeover-%016zx-%d.lock", std::hash<std::string>{}(token),
                static_cast<int>(launcher));
  return (fs::temp_directory_path() / name).string();
}

void start_successor(node& n, const std::string& token, pid_t launcher) {
  if (n.local_actor(successor_name)) return;
  auto st = std::make_shared<successor_state>();
  st->n = &n;
  st->token = token;
  st->launcher = launcher > 0 ? launcher : ::getppid();
  caf::actor a = n.system().spawn(successor_actor, st);
  if (auto err = n.publish(successor_name, a)) {
    spdlog::warn("cannot publish {}: {}", successor_name, error_message(err));
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
}

takeover_state read_takeover_file(const std::string& path) {
  const std::string bytes = read_whole_file(path, "takeover file");
  remote_message m;
  m.type = successor_type;
  m.body.assign(bytes.begin(), bytes.end());
  std::error_code ec;
  fs::remove(path, ec);
  auto s = decode_takeover(m);
  if (!s) throw std::invalid_argument("malformed takeover file " + path + ": " + error_message(s.error()));
  return std::move(*s);
}

}  // namespace corolla::app
