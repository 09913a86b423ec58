#include "apps/train_lobby.hpp"
#include "net/endpoint.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>
#include <stdexcept>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "actors/capnp_body.hpp"
#include "actors/errors.hpp"
#include "actors/train_scheduler.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "apps/commands.hpp"
#include "apps/rank_assignment.hpp"
#include "apps/rank_processes.hpp"
#include "apps/self_process.hpp"
#include "apps/train_args.hpp"
#include "apps/train_job_file.hpp"
#include "model/whole_file.hpp"
#include "net/wire.capnp.h"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;

constexpr const char* offer_type = "train.offer";
constexpr const char* assign_type = "train.assign";
constexpr const char* release_type = "train.release";

/// A machine's description is a few lines of TOML.
constexpr std::size_t max_machine_bytes = 16 << 10;

remote_message offer_message(const std::string& name, const std::string& machine) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainOffer>();
  r.setName(name);
  r.setMachine(machine);
  remote_message m;
  m.type = offer_type;
  m.body = capnp_body::flat(b);
  return m;
}


/// --join-machine FILE: its text, and the worker it describes
/// ("<name>/0"). Throws model_error for a file that is missing or cannot
/// be read, std::invalid_argument for one that is no TOML or has no node
/// name (the launcher checks the rest against its cluster file).
std::pair<std::string, std::string> read_machine(const std::string& path) {
  // A machine is described in at most 16 KiB (the launcher refuses more).
  std::string text = read_whole_file(path, "--join-machine", max_machine_bytes);
  try {
    const toml::table t = toml::parse(text, path);
    const auto name = t["name"].value<std::string>();
    if (!name || name->empty()) throw std::invalid_argument("--join-machine " + path + ": no node 'name'");
    return {std::move(text), *name + "/0"};
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument("--join-machine " + path + ":" + std::to_string(e.source().begin.line) +
                                ": invalid TOML: " + std::string(e.description()));
  }
}

struct lobby_state {
  std::vector<lobby_worker> pool;
};

caf::behavior lobby_actor(caf::event_based_actor*, std::shared_ptr<lobby_state> st) {
  return {
      [st](remote_message& m) {
        if (m.type != offer_type || m.from_node.empty()) return;
        auto offer = capnp_body::decode<wire::TrainOffer>(m.body, "TrainOffer", [&](wire::TrainOffer::Reader r) {
          return lobby_worker{m.from_node, capnp_body::text(r.getName(), "name"),
                              capnp_body::text(r.getMachine(), "machine", max_machine_bytes)};
        });
        if (!offer) {
          spdlog::warn("dropping an offer from node {}: {}", m.from_node, error_message(offer.error()));
          return;
        }
        for (const lobby_worker& w : st->pool)
          if (w.node_id == m.from_node) return;
        std::fprintf(stderr, "elastic: worker %s (node %s%s) joined the pool\n", offer->name.c_str(),
                     m.from_node.c_str(), offer->machine.empty() ? "" : ", describing its machine");
        st->pool.push_back(std::move(*offer));
      },
      [st](const peer_down& d) {
        for (auto it = st->pool.begin(); it != st->pool.end(); ++it)
          if (it->node_id == d.peer) {
            std::fprintf(stderr, "elastic: worker %s left the pool (%s)\n", it->name.c_str(), d.reason.c_str());
            st->pool.erase(it);
            return;
          }
      },
      [](const peer_up&) {},
      [st](sched_msg::pool_atom) { return flat_pool(st->pool); },
  };
}

}  // namespace

// ---- the launcher's side ----------------------------------------------------------

train_lobby::train_lobby(const std::string& endpoint) {
  node_ = start_node(rank_node_options(endpoint), "lobby");
  // Detached: the elastic scheduler, in an actor system of its own, asks it
  // for the pool (a detached receiver runs on its own thread, never on the
  // sender's system).
  actor_ = node_->system().spawn<caf::detached>(lobby_actor, std::make_shared<lobby_state>());
  if (auto err = node_->publish("train-lobby", actor_)) {
    caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
    throw std::runtime_error("cannot publish the lobby: " + error_message(err));
  }
  node_->monitor_peer("", actor_);
}

train_lobby::~train_lobby() {
  try {
    release_all();
  } catch (const std::exception&) {
  }
  node_->unpublish("train-lobby");
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

std::string train_lobby::endpoint() const { return node_->endpoint(); }

std::vector<lobby_worker> train_lobby::pool() {
  std::vector<lobby_worker> out;
  std::string failed;
  caf::scoped_actor self{node_->system()};
  self->request(actor_, std::chrono::seconds(10), sched_msg::pool_atom::value)
      .receive([&](std::vector<std::string>& flat) { out = pool_of_flat(flat); },
          [&](caf::error& e) { failed = to_string(e); });
  if (!failed.empty()) throw std::runtime_error("the lobby did not answer: " + failed);
  return out;
}

void train_lobby::assign(const std::string& node_id, const std::vector<std::string>& args, const std::string& job_json) {
  auto joiner = node_->remote_actor(node_id, "train-joiner");
  if (!joiner) throw std::runtime_error("cannot reach worker " + node_id + ": " + error_message(joiner.error()));
  caf::anon_send(*joiner, assignment_message(assign_type, {args, job_json}));
}

void train_lobby::release_all() {
  for (const lobby_worker& w : pool())
    if (auto joiner = node_->remote_actor(w.node_id, "train-joiner")) {
      remote_message m;
      m.type = release_type;
      caf::anon_send(*joiner, std::move(m));
    }
  // The releases leave before the node goes (node::stop hands sent messages to the link first).
}

namespace {

/// "tcp://HOST:0": a free port on `host`.
std::string any_port_on(const std::string& host) {
  return "tcp://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":0";
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1";
}

std::string launcher_listen(const train_args& a) {
  if (a.join_listen.empty()) return "tcp://127.0.0.1:0";
  const std::string host = net::tcp_endpoint_host(a.join_listen);
  if (host.empty() || host == "*" || host == "0.0.0.0" || host == "::")
    throw std::invalid_argument("--join-listen " + a.join_listen +
                                ": give the address other machines reach this one at (the coordinator and the "
                                "local ranks listen there too), not a wildcard");
  return any_port_on(host);
}

// ---- the worker's side ---------------------------------------------------------------

int run_train_join(const train_args& a) {
  apply_common_options(1, "warn");
  // --join-machine: a machine no worker of the job's cluster file stands
  // for describes itself (schedule::with_machine); it runs as its node's worker 0.
  std::string machine, described;
  if (!a.join_machine.empty()) std::tie(machine, described) = read_machine(a.join_machine);
  if (!described.empty() && !a.join_name.empty() && a.join_name != described)
    throw std::invalid_argument("--join-name " + a.join_name + ": the machine " + a.join_machine + " describes runs as " +
                                described + " (leave --join-name out)");
  const std::string lobby_ep = a.join.rfind("tcp://", 0) == 0 ? a.join : "tcp://" + a.join;
  auto n = start_node(rank_node_options(a.listen), "worker");
  connect_options co;
  co.timeout = std::chrono::seconds(30);
  auto lobby = n->connect(lobby_ep, co);
  if (!lobby) throw std::runtime_error("cannot reach the launcher at " + lobby_ep + ": " + error_message(lobby.error()));
  // The launcher's words in their order; its going away is the last one
  // (a release sent just before its node stopped is still taken first).
  auto inbox = std::make_shared<train_inbox>();
  auto gone = std::make_shared<std::atomic<bool>>(false);
  const std::string from = *lobby;
  caf::actor box = n->system().spawn([inbox, gone, from](caf::event_based_actor*) -> caf::behavior {
    return {
        [inbox, from](remote_message& m) {
          // Only the launcher this worker joined gives it work.
          if (m.from_node == from && (m.type == assign_type || m.type == release_type)) inbox->put("lobby", std::move(m));
        },
        [inbox, gone, from](const peer_down& d) {
          if (d.peer != from) return;
          *gone = true;
          remote_message m;
          m.type = "gone";
          m.body.assign(d.reason.begin(), d.reason.end());
          inbox->put("lobby", std::move(m));
        },
        [](const peer_up&) {},
    };
  });
  if (auto err = n->publish("train-joiner", box)) throw std::runtime_error("cannot publish train-joiner: " + error_message(err));
  n->monitor_peer("", box);
  auto target = n->remote_actor(*lobby, "train-lobby");
  if (!target) throw std::runtime_error(lobby_ep + " takes no workers: " + error_message(target.error()));
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string name = !described.empty() ? described
                           : a.join_name.empty() ? std::string(host) + "-" + std::to_string(::getpid())
                                                 : a.join_name;
  caf::anon_send(*target, offer_message(name, machine));
  std::fprintf(stderr, "joined the pool of %s as %s; waiting for a rank\n", lobby_ep.c_str(), name.c_str());
  std::fflush(stderr);
  const std::string listen_host = net::tcp_endpoint_host(a.listen);  // where the ranks it runs listen
  int status = 1;
  for (;;) {
    remote_message m;
    try {
      m = inbox->take("lobby", std::chrono::hours(24 * 365), "the launcher's word");
    } catch (const train_error& e) {
      std::fprintf(stderr, "corolla: error: %s\n", e.what());
      break;
    }
    if (m.type == release_type) {
      std::fprintf(stderr, "released: the job is over\n");
      status = 0;
      break;
    }
    if (m.type == "gone") {
      std::fprintf(stderr, "corolla: error: the launcher at %s is down: %s\n", lobby_ep.c_str(),
                   std::string(m.body.begin(), m.body.end()).c_str());
      break;
    }
    auto work = decode_assignment(m);
    if (!work) {
      spdlog::warn("ignoring a bad assignment: {}", error_message(work.error()));
      continue;
    }
    auto at = std::find(work->args.begin(), work->args.end(), "--job-file");
    if (work->args.front() != "train" || arg_after(work->args, "--job-file").empty() ||
        arg_after(work->args, "--rank").empty()) {
      spdlog::warn("ignoring an assignment that is not a training rank");
      continue;
    }
    const std::unique_ptr<held_job_file> held = write_job_file(worker_job_file_prefix, work->job);
    const fs::path path = held->path();
    *(at + 1) = path.string();
    const std::string rank = arg_after(work->args, "--rank");
    // The rank listens on this worker's address (--listen), where the
    // launcher's ranks and coordinator reach it.
    if (auto l = std::find(work->args.begin(), work->args.end(), "--listen"); l != work->args.end() && l + 1 != work->args.end())
      *(l + 1) = any_port_on(listen_host);
    else
      work->args.insert(work->args.end(), {"--listen", any_port_on(listen_host)});
    std::fprintf(stderr, "running rank %s (listening on %s)\n", rank.c_str(), listen_host.c_str());
    std::fflush(stderr);
    // As the launcher does with its own ranks: a rank process stopped
    // (SIGSTOP, a debugger) for min(--hang-s, 2 s) is hung. Killed, its
    // links drop at once and its peers report it down, instead of after
    // their 10 s timeout.
    const auto job = nlohmann::json::parse(work->job, nullptr, false);
    const double hang_s = job.is_object() ? job.value("hang_s", 0.0) : 0.0;
    rank_processes child;
    child.start(work->args);
    // The rank ends with its grid (or dies with it); the launcher going away ends it too.
    child.watch(
        *gone, [](int, const std::string&) {}, stopped_limit_s(hang_s),
        [&](int, double seconds) {
          std::fprintf(stderr, "rank %s has been stopped (SIGSTOP or a debugger) for %.1f s: killed\n", rank.c_str(),
                       seconds);
          ::kill(child.pid(0), SIGKILL);
        });
    child.stop();
    std::error_code ec;
    fs::remove(path, ec);
  }
  return status;
}

}  // namespace corolla::app
