// `corolla faultlab` on a swarm: the scenario's servers as local `corolla
// serve` processes, the client in this process generating greedily through
// them, and the faults fired at their token (or second) from the client's
// token callback, so "token 10" means exactly after the 10th token.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/node_control.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "apps/commands.hpp"
#include "apps/control_token_env.hpp"
#include "apps/faultlab_harness.hpp"
#include "apps/faultlab.hpp"
#include "apps/local_swarm.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/head.hpp"
#include "model/safetensors.hpp"

namespace corolla::app {

namespace {

using clock_type = std::chrono::steady_clock;
namespace fl = faultlab;

/// The servers of the client's current route, hop by hop, from its events
/// ("route [0, 2) via s0 -> [2, 4) via s1", "replacing s1 on [2, 4) with ...").
class route_tracker {
 public:
  void on_event(const std::string& line) {
    std::lock_guard lock(mu_);
    if (line.rfind("route ", 0) == 0) {
      hops_ = parse(line.substr(6));
    } else if (line.rfind("replacing ", 0) == 0) {
      const auto with = line.find(" with ");
      const auto lost_end = line.find(" on ");
      if (with == std::string::npos || lost_end == std::string::npos) return;
      const std::string lost = line.substr(10, lost_end - 10);
      const auto replacement = parse(line.substr(with + 6, line.find("; replaying") - with - 6));
      for (std::size_t i = 0; i < hops_.size(); ++i)
        if (hops_[i].second == lost) {
          hops_.erase(hops_.begin() + static_cast<std::ptrdiff_t>(i));
          hops_.insert(hops_.begin() + static_cast<std::ptrdiff_t>(i), replacement.begin(), replacement.end());
          break;
        }
    }
  }
  /// The server of hop `k`, or "" when the route has fewer hops.
  std::string hop(int k) const {
    std::lock_guard lock(mu_);
    return k >= 0 && k < static_cast<int>(hops_.size()) ? hops_[static_cast<std::size_t>(k)].second : std::string();
  }

 private:
  static std::vector<std::pair<std::string, std::string>> parse(const std::string& text) {
    static const std::regex hop(R"((\[\d+, \d+\)) via (\S+))");
    std::vector<std::pair<std::string, std::string>> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), hop); it != std::sregex_iterator(); ++it)
      out.emplace_back((*it)[1].str(), (*it)[2].str());
    return out;
  }
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> hops_;
};

/// The servers and what faults did to them.
struct swarm_state {
  const fl::swarm_job& job;
  const std::filesystem::path& logs;
  local_swarm procs;
  std::map<std::string, std::pair<int, int>> blocks;  ///< by id
  std::set<std::string> running, stopped, dead;
  int joined = 0;
  std::set<std::string> corrupted;  ///< told to answer wrong (and not restarted since)
  std::vector<std::string> relays;   ///< the relays' ids, "r0", ...: in every NAT server's --relay order
  std::set<std::string> behind_nat;  ///< the servers started with --no-listen
  std::set<std::string> partitioned; ///< cut off by a partition and not healed since
  std::set<std::string> throttled;   ///< sends reshaped by a throttle and not healed since
  bool is_relay(const std::string& id) const { return std::find(relays.begin(), relays.end(), id) != relays.end(); }
  /// Where server `id` listens (its latest process), "" when it never started.
  std::string endpoint_of(const std::string& id) const {
    std::string endpoint;
    for (const auto& s : procs.servers())
      if (s.id == id) endpoint = s.endpoint;
    return endpoint;
  }
  /// How the client (and the harness) reach server `id`: its endpoint, or
  /// ID@RELAY through the first of the relays still answering (running and
  /// not partitioned; "" when none does). A server behind NAT moves there
  /// when its relay stops answering.
  std::string address_of(const std::string& id) const {
    if (!behind_nat.count(id)) return endpoint_of(id);
    for (const std::string& r : relays)
      if (running.count(r) && !partitioned.count(r)) return id + "@" + endpoint_of(r);
    return "";
  }
  mutable std::mutex mu;  ///< the endpoints list, read by the client's discover

  void start(const std::string& id, int first, int last) {
    std::vector<std::string> flags{"--threads", "1", "--log-level", "warn"};
    if (!job.link.empty()) flags.insert(flags.end(), {"--link-profile", job.link});
    if (behind_nat.count(id)) {
      std::string list;
      for (const std::string& r : relays) list += (list.empty() ? "" : ",") + endpoint_of(r);
      flags.insert(flags.end(), {"--no-listen", "--relay", list});
    }
    procs.start(job.model, id, first, last, flags, logs / (id + ".log"));
    std::lock_guard lock(mu);
    blocks[id] = {first, last};
    running.insert(id);
    dead.erase(id);
    stopped.erase(id);
    partitioned.erase(id);  // a new process
    throttled.erase(id);
  }
  void start_relay(const std::string& id) {
    std::vector<std::string> flags{"--log-level", "warn"};
    if (!job.link.empty()) flags.insert(flags.end(), {"--link-profile", job.link});
    procs.start_relay(id, flags, logs / (id + ".log"));
    std::lock_guard lock(mu);
    relays.push_back(id);
    running.insert(id);
  }
  /// The servers not killed, as the client dials them (the latest process
  /// of each id): an endpoint, or ID@RELAY for one behind NAT, through the
  /// first of its relays still running, which is where it goes when the
  /// relay it had stops answering (none running: left out, unreachable).
  std::vector<std::string> live_endpoints() const {
    std::lock_guard lock(mu);
    std::set<std::string> ids;
    for (const auto& s : procs.servers()) ids.insert(s.id);
    std::vector<std::string> out;
    for (const std::string& id : ids) {
      if (dead.count(id) || is_relay(id)) continue;
      if (std::string address = address_of(id); !address.empty()) out.push_back(std::move(address));
    }
    return out;
  }
  std::string pick(std::mt19937_64& rng, const std::set<std::string>& from) const {
    if (from.empty()) return "";
    std::uniform_int_distribution<std::size_t> d(0, from.size() - 1);
    return *std::next(from.begin(), static_cast<std::ptrdiff_t>(d(rng)));
  }
};

fault_outcome fire(const fl::fault& f, swarm_state& st, faultlab_harness& harness, const route_tracker& route,
                   std::mt19937_64& rng, std::string& hit) {
  using tk = fl::target::kind;
  if (f.what == fl::action::join) {
    const auto [a, b] = fl::parse_blocks(f.blocks);
    const std::string id = "j" + std::to_string(st.joined++);
    st.start(id, a, b);
    hit = id;
    return landed("join " + id + " on blocks [" + std::to_string(a) + ", " + std::to_string(b) + ")");
  }
  std::string id;
  switch (f.whom.k) {
    case tk::server: id = "s" + std::to_string(f.whom.index); break;
    case tk::route_hop: id = route.hop(f.whom.index); break;
    case tk::relay: id = "r" + std::to_string(f.whom.index); break;
    case tk::random_server: {
      std::set<std::string> from = f.what == fl::action::resume    ? st.stopped
                                   : f.what == fl::action::restart ? st.dead
                                                                   : st.running;
      std::erase_if(from, [&st](const std::string& r) { return st.is_relay(r); });  // servers only
      id = st.pick(rng, from);
      break;
    }
    default: break;
  }
  const std::string what = std::string(fl::to_string(f.what)) + " " + fl::to_string(f.whom);
  if (id.empty()) return missed(what + ": no server to hit (skipped)");
  hit = id;
  switch (f.what) {
    case fl::action::kill:
      if (st.dead.count(id)) return missed(what + ": " + id + " is dead already (skipped)");
      st.procs.signal(id, SIGKILL);
      {
        std::lock_guard lock(st.mu);
        st.running.erase(id);
        st.stopped.erase(id);
        st.dead.insert(id);
      }
      return landed(what + " (" + id + ")");
    case fl::action::stop:
      if (!st.running.count(id)) return missed(what + ": " + id + " is not running (skipped)");
      st.procs.signal(id, SIGSTOP);
      st.running.erase(id);
      st.stopped.insert(id);
      return landed(what + " (" + id + ")");
    case fl::action::resume:
      if (!st.stopped.count(id)) return missed(what + ": " + id + " is not stopped (skipped)");
      st.procs.signal(id, SIGCONT);
      st.stopped.erase(id);
      st.running.insert(id);
      return landed(what + " (" + id + ")");
    case fl::action::restart: {
      if (!st.dead.count(id)) {  // a running (or stopped) server dies first
        st.procs.signal(id, SIGKILL);
        std::lock_guard lock(st.mu);
        st.dead.insert(id);
      }
      const auto [a, b] = st.blocks.at(id);
      st.start(id, a, b);
      st.corrupted.erase(id);  // a new process answers right
      return landed(what + " (" + id + ", a new process)");
    }
    case fl::action::throttle:
    case fl::action::partition:
    case fl::action::heal: {
      if (st.dead.count(id)) return missed(what + ": " + id + " is dead (skipped)");
      const std::string endpoint = st.address_of(id);
      if (endpoint.empty()) return missed(what + ": " + id + " is behind NAT and no relay runs (skipped)");
      if (f.what == fl::action::heal && !st.partitioned.count(id) && !st.throttled.count(id))
        return missed(what + ": " + id + " is neither throttled nor partitioned (skipped)");
      const std::string err = f.what == fl::action::heal        ? harness.heal(endpoint)
                              : f.what == fl::action::partition ? harness.partition(endpoint, true)
                                                                : harness.reshape(endpoint, f.profile);
      if (!err.empty()) return missed(what + " (" + id + "): failed: " + err);
      {
        std::lock_guard lock(st.mu);  // the client's discovery reads `partitioned`
        if (f.what == fl::action::heal) {
          st.partitioned.erase(id);
          st.throttled.erase(id);
        } else if (f.what == fl::action::partition) {
          st.partitioned.insert(id);
        } else {
          st.throttled.insert(id);
        }
      }
      if (f.what == fl::action::heal) return landed(what + " (" + id + ", back to its own shaping, no partition)");
      if (f.what == fl::action::partition) return landed(what + " (" + id + ", traffic with every peer dropped)");
      return landed(what + " (" + id + ", sends shaped " + f.profile + ")");
    }
    case fl::action::corrupt: {
      if (st.dead.count(id)) return missed(what + ": " + id + " is dead (skipped)");
      const std::string address = st.address_of(id);
      if (address.empty()) return missed(what + ": " + id + " is behind NAT and no relay runs (skipped)");
      if (const std::string err = harness.corrupt(address); !err.empty())
        return missed(what + " (" + id + "): failed: " + err);
      st.corrupted.insert(id);
      return landed(what + " (" + id + ", wrong outputs from now on)");
    }
    case fl::action::join:
    case fl::action::hang:
    case fl::action::lose: break;  // not a swarm's (the scenario refuses them)
  }
  return missed(what + ": not a swarm's fault (skipped)");
}

}  // namespace

faultlab_run run_swarm_scenario(const fl::scenario& s, bool inject, std::mt19937_64& rng,
                                const std::filesystem::path& logs) {
  const fl::swarm_job& job = *s.swarm;
  faultlab_run run;
  const auto t0 = clock_type::now();
  auto last = t0;  // the last token (or the start)
  try {
    const model_config cfg = load_config(job.model);
    const control_token_env control;
    swarm_state st{job, logs, {}, {}, {}, {}, {}, 0, {}, {}, {}, {}, {}};
    for (int r = 0; r < job.relays; ++r) st.start_relay("r" + std::to_string(r));
    for (int k : job.nat) st.behind_nat.insert("s" + std::to_string(k));
    for (std::size_t i = 0; i < job.servers.size(); ++i) {
      const auto [a, b] = job.servers[i];
      if (b > cfg.n_layers)
        throw std::invalid_argument("server " + std::to_string(i) + " holds blocks up to " + std::to_string(b) +
                                    ", the model has " + std::to_string(cfg.n_layers));
      st.start("s" + std::to_string(i), a, b);
    }
    auto n = node::start([&job] {
      node_options o;
      o.listen = "";
      if (!job.link.empty()) o.link_profile = job.link;
      return o;
    }());
    if (!n) throw std::runtime_error("cannot start the client node: " + error_message(n.error()));
    faultlab_harness harness(control.token());
    route_tracker route;
    swarm_client_options o;
    o.model = model_id_of(job.model);
    o.discover = [&st] { return st.live_endpoints(); };
    o.refresh_period = std::chrono::seconds(1);  // joined and restarted servers are found soon
    o.request_timeout = std::chrono::seconds(5);  // a stopped server is given up on within this
    for (const fl::fault& f : s.faults)
      run.faults.push_back({fl::to_string(f.at), fl::to_string(f.what),
                            f.what == fl::action::join ? "blocks " + f.blocks : fl::to_string(f.whom)});
    const auto since_start = [&t0] { return std::chrono::duration<double>(clock_type::now() - t0).count(); };
    o.on_event = [&route, &run, &since_start, &st](const std::string& line) {
      spdlog::info("faultlab client: {}", line);
      route.on_event(line);
      // The client noticed a server's failure (or a wrong answer).
      if (line.find("failed") != std::string::npos || line.find("wrong") != std::string::npos) {
        const double t = since_start();
        run.noticed("client", line, t);
        // A server behind NAT that failed was reached through a relay: a
        // fault on a relay shows to the client as its servers failing.
        for (const std::string& id : st.behind_nat)
          if (line.find("server " + id + " failed") != std::string::npos)
            for (const std::string& r : st.relays) run.noticed("client", line, t, false, r);
      }
    };
    o.spot_checks.fraction = job.spot_checks;
    o.spot_checks.probation_steps = job.spot_check_probation;
    o.spot_check_seed = rng();
    swarm_client client(**n, o);
    head h = head::load(checkpoint::open(job.model), cfg, cpu_backend());
    generation_params p;
    p.max_new_tokens = job.new_tokens;
    p.ignore_eos = true;
    std::vector<bool> fired(s.faults.size(), false);
    last = clock_type::now();
    int count = 0;
    const auto on_token = [&](std::int32_t) {
      const auto now = clock_type::now();
      run.max_stall_s = std::max(run.max_stall_s, std::chrono::duration<double>(now - last).count());
      last = now;
      ++count;
      const double elapsed = std::chrono::duration<double>(now - t0).count();
      run.progressed(elapsed);
      if (!inject) return;
      for (std::size_t i = 0; i < s.faults.size(); ++i) {
        const fl::fault& f = s.faults[i];
        const bool due = f.at.k == fl::moment::kind::token ? count >= f.at.value : elapsed >= f.at.value;
        if (fired[i] || !due) continue;
        fired[i] = true;
        fault_timeline& t = run.faults[i];
        t.injected_at_s = std::chrono::duration<double>(clock_type::now() - t0).count();
        fault_outcome o = fire(f, st, harness, route, rng, t.hit);
        t.outcome = std::move(o.line);
        t.landed = o.landed;
        run.events.push_back("token " + std::to_string(count) + ": " + t.outcome);
      }
      // Waiting for a joined or restarted server to load is the harness's
      // time, not a stall of the swarm.
      last = clock_type::now();
    };
    swarm_generation g = swarm_generate(client, h, job.prompt_ids, p, on_token);
    run.tokens = g.result.tokens;
    run.recoveries = g.failovers;
    run.completed = true;
    run.corrupted.assign(st.corrupted.begin(), st.corrupted.end());
    for (const auto& w : g.spot_checks.wrong) run.wrong_servers.push_back(w.server);
    run.spot_checks = g.spot_checks.checks;
    for (std::size_t i = 0; i < s.faults.size(); ++i)
      if (inject && !fired[i]) run.events.push_back(fl::to_string(s.faults[i].at) + ": never reached (the run ended first)");
    (*n)->stop();
  } catch (const std::exception& e) {
    run.error = e.what();
    // Waiting for the token that never came counts as a stall too.
    run.max_stall_s = std::max(run.max_stall_s, std::chrono::duration<double>(clock_type::now() - last).count());
  }
  run.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  return run;
}

}  // namespace corolla::app
