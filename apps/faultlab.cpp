// corolla faultlab — the fault-injection harness (docs/faultlab.md):
//   corolla faultlab run SCENARIO.toml [--json] [--report DIR] [--seed S]
//   corolla faultlab random (--swarm | --train) --model DIR [--data FILE] [--faults N] [--seed S] [--json] [--report DIR]
// runs the scenario's job as real local processes twice, first without
// faults (the reference) and then with them, checks the expectations and
// exits 0 when every one holds, 1 otherwise.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "apps/commands.hpp"
#include "apps/faultlab.hpp"
#include "apps/flag_checks.hpp"
#include "model/config.hpp"
#include "model/whole_file.hpp"

namespace corolla::app {
namespace {

namespace fs = std::filesystem;
namespace fl = faultlab;
using json = nlohmann::json;

struct faultlab_args {
  std::string scenario;
  bool json_out = false;
  std::string report;
  std::int64_t seed = -1;  ///< -1: the scenario's
  // random
  bool swarm = false, train = false;
  std::string model, data;
  int faults = 2;
  std::string replay;  ///< the command that runs this campaign again, but for its --seed
};

/// `word` as one shell word: as it is when it is plain, else in single quotes.
std::string shell_word(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/:=+-,@") ==
                           std::string::npos)
    return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct check {
  std::string name;
  bool ok = false;
  std::string detail;
};

std::vector<check> judge(const fl::scenario& s, const faultlab_run& ref, const faultlab_run& hit) {
  std::vector<check> out;
  out.push_back({"reference completed", ref.completed, ref.completed ? "" : ref.error});
  out.push_back({"faulted run completed", hit.completed, hit.completed ? "" : hit.error});
  if (s.expect.same_output_as_reference) {
    const bool same = ref.completed && hit.completed && ref.tokens == hit.tokens;
    std::string detail;
    if (!same && hit.completed && ref.completed) {
      std::size_t i = 0;
      while (i < ref.tokens.size() && i < hit.tokens.size() && ref.tokens[i] == hit.tokens[i]) ++i;
      detail = "first difference at token " + std::to_string(i + 1) + " of " + std::to_string(ref.tokens.size());
    }
    out.push_back({"same output as the reference", same, detail});
  }
  if (s.expect.same_losses_as_reference) {
    bool same = ref.completed && hit.completed && ref.losses.size() == hit.losses.size();
    std::string detail;
    for (std::size_t i = 0; same && i < ref.losses.size(); ++i)
      if (std::abs(ref.losses[i] - hit.losses[i]) > 1e-5 * std::abs(ref.losses[i])) {
        same = false;
        detail = "step " + std::to_string(i + 1) + ": " + std::to_string(hit.losses[i]) + " against " +
                 std::to_string(ref.losses[i]);
      }
    if (same || detail.empty())
      detail = std::to_string(hit.losses.size()) + " steps (reference " + std::to_string(ref.losses.size()) + ")";
    out.push_back({"same losses as the reference (1e-5 relative)", same, detail});
  }
  if (s.expect.wrong_servers_caught) {
    std::set<std::string> corrupted(hit.corrupted.begin(), hit.corrupted.end()),
        caught(hit.wrong_servers.begin(), hit.wrong_servers.end());
    auto list = [](const std::set<std::string>& ids) {
      std::string out;
      for (const auto& id : ids) out += (out.empty() ? "" : ", ") + id;
      return out.empty() ? std::string("none") : out;
    };
    out.push_back({"spot checks caught every corrupted server and nobody else",
                   hit.completed && corrupted == caught && ref.wrong_servers.empty(),
                   "corrupted: " + list(corrupted) + "; found wrong: " + list(caught) + " (" +
                       std::to_string(hit.spot_checks) + " checks)"});
  }
  if (s.expect.max_stall_s > 0) {
    char d[96];
    std::snprintf(d, sizeof d, "longest wait %.2f s (limit %.2f s)", hit.max_stall_s, s.expect.max_stall_s);
    out.push_back({"no stall longer than the limit", hit.max_stall_s <= s.expect.max_stall_s, d});
  }
  // A fault that did nothing leaves the run testing less than the
  // scenario says: its moment never came, or its target was not there.
  if (!hit.faults.empty()) {
    bool ok = true;
    std::string detail;
    for (std::size_t i = 0; i < hit.faults.size(); ++i) {
      const fault_timeline& f = hit.faults[i];
      std::string why;
      if (f.injected_at_s < 0) {
        why = f.at + " never reached";
        ok = false;
      } else if (!f.landed) {
        why = f.outcome;
        ok = ok && !s.expect.every_fault_hits;
      }
      if (!why.empty()) detail += (detail.empty() ? "" : "; ") + ("fault[" + std::to_string(i) + "]: " + why);
    }
    out.push_back({s.expect.every_fault_hits ? "every fault fired on its target"
                                             : "every fault fired (targets may be gone: every_fault_hits = false)",
                   ok, detail});
  }
  return out;
}

json run_json(const faultlab_run& r) {
  json j = {{"completed", r.completed}, {"seconds", r.seconds}, {"max_stall_s", r.max_stall_s},
            {"recoveries", r.recoveries}, {"events", r.events}, {"progress_s", r.progress_s}};
  if (!r.corrupted.empty() || !r.wrong_servers.empty() || r.spot_checks > 0) {
    j["corrupted"] = r.corrupted;
    j["wrong_servers"] = r.wrong_servers;
    j["spot_checks"] = r.spot_checks;
  }
  if (!r.error.empty()) j["error"] = r.error;
  if (!r.tokens.empty()) j["tokens"] = r.tokens;
  if (!r.losses.empty()) j["losses"] = r.losses;
  return j;
}

/// Runs `s` (reference, then faults), prints the verdict; returns the exit status.
int run_scenario(fl::scenario s, const faultlab_args& a) {
  fs::path dir = a.report.empty() ? fs::temp_directory_path() / ("corolla-faultlab-" + std::to_string(::getpid()))
                                  : fs::path(a.report);
  fs::create_directories(dir);
  // An earlier run's report and logs go: what stays in DIR is this run's
  // (a log of a server the new scenario does not have would mislead).
  // Only where a report says they are faultlab's: --report . in a folder
  // of the user's own "reference/" keeps it.
  if (fs::is_regular_file(dir / "report.json"))
    for (const char* old : {"report.json", "timeline.svg", "reference", "faults"}) fs::remove_all(dir / old);
  materialize_builtins(s, dir);
  // What the scenario asks of its model and data, before any process starts.
  const std::string origin = a.scenario.empty() ? "random campaign" : a.scenario;
  const std::string& model = s.swarm ? s.swarm->model : s.train->model;
  model_config cfg;
  try {
    cfg = load_config(model);
  } catch (const std::exception& e) {
    throw std::invalid_argument(origin + ": " + (s.swarm ? "swarm" : "train") + ".model: " + e.what());
  }
  fl::check_against_model(s, cfg.n_layers, cfg.vocab_size, cfg.max_positions, origin);
  if (std::error_code ec; s.train && !fs::is_regular_file(s.train->data, ec))
    throw std::invalid_argument(origin + ": train.data: " + s.train->data + " is not a file");
  const std::uint64_t seed = a.seed >= 0 ? static_cast<std::uint64_t>(a.seed) : s.seed;
  std::mt19937_64 rng(seed);
  auto run = [&](bool inject) {
    const fs::path logs = dir / (inject ? "faults" : "reference");
    fs::create_directories(logs);
    if (!a.json_out) std::fprintf(stderr, "faultlab: %s run of '%s'...\n", inject ? "faulted" : "reference", s.name.c_str());
    return s.swarm ? run_swarm_scenario(s, inject, rng, logs) : run_train_scenario(s, inject, rng, logs);
  };
  const faultlab_run ref = run(false);
  const faultlab_run hit = run(true);
  const std::vector<check> checks = judge(s, ref, hit);
  bool pass = true;
  for (const check& c : checks) pass = pass && c.ok;
  json report = {{"scenario", s.name}, {"seed", seed}, {"kind", s.swarm ? "swarm" : "train"}, {"pass", pass},
                 {"held", pass}, {"reference", run_json(ref)}, {"faulted", run_json(hit)},
                 {"checks", json::array()}, {"faults", json::array()}};
  for (const check& c : checks) report["checks"].push_back({{"name", c.name}, {"ok", c.ok}, {"detail", c.detail}});
  const auto seconds = [](double t) { return t < 0 ? json(nullptr) : json(t); };
  for (const fault_timeline& f : hit.faults)
    report["faults"].push_back({{"at", f.at}, {"do", f.what}, {"target", f.target}, {"hit", f.hit},
                                {"outcome", f.outcome}, {"landed", f.landed}, {"injected_at_s", seconds(f.injected_at_s)},
                                {"detected_at_s", seconds(f.detected_at_s)}, {"recovered_at_s", seconds(f.recovered_at_s)},
                                {"detected_by", f.detected_by}});
  report["report_dir"] = dir.string();
  write_timeline_svg(dir, s.name, s.swarm ? "tokens" : "steps", ref, hit);
  std::ofstream(dir / "report.json") << report.dump(2) << "\n";
  if (a.json_out) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    std::printf("faultlab: %s (seed %llu)\n", s.name.c_str(), static_cast<unsigned long long>(seed));
    for (const std::string& e : hit.events) std::printf("  fault  %s\n", e.c_str());
    for (const fault_timeline& f : hit.faults) {
      if (f.injected_at_s < 0) continue;
      std::printf("  when   %s %s at %.2f s: ", f.what.c_str(), f.hit.empty() ? f.target.c_str() : f.hit.c_str(),
                  f.injected_at_s);
      if (f.detected_at_s < 0)
        std::printf("not noticed by the job\n");
      else if (f.recovered_at_s < 0)
        std::printf("noticed at %.2f s, no progress after\n", f.detected_at_s);
      else
        std::printf("noticed at %.2f s, next %s at %.2f s\n", f.detected_at_s, s.swarm ? "token" : "step",
                    f.recovered_at_s);
    }
    std::printf("  reference: %s in %.1f s; faulted: %s in %.1f s, %d recover%s, longest wait %.2f s\n",
                ref.completed ? "completed" : "FAILED", ref.seconds, hit.completed ? "completed" : "FAILED", hit.seconds,
                hit.recoveries, hit.recoveries == 1 ? "y" : "ies", hit.max_stall_s);
    for (const check& c : checks)
      std::printf("  %s  %s%s\n", c.ok ? "pass" : "FAIL", c.name.c_str(), c.detail.empty() ? "" : (": " + c.detail).c_str());
    std::printf("%s; report and logs in %s\n", pass ? "PASS" : "FAIL", dir.string().c_str());
    if (!pass) std::printf("replay: %s --seed %llu\n", a.replay.c_str(), static_cast<unsigned long long>(seed));
  }
  std::fflush(stdout);
  return pass ? 0 : 1;
}

/// `s` as a TOML string, quoted and escaped (paths may hold anything).
std::string toml_quoted(const std::string& s) {
  std::ostringstream out;
  out << toml::value<std::string>(s);
  return out.str();
}

/// A random campaign (Jepsen style). For a swarm: every block served three
/// times, by two chains of two half-model servers and one server of the
/// whole model, `faults` kills or partitions at random tokens, never of a
/// server whose blocks nobody else holds any more, and one random server
/// throttled for four tokens. In about a third of the campaigns one of the
/// faults is instead a wrong server: three chains of two half-model
/// servers, the client spot-checking every step, and whoever serves the
/// first hop at a random token answering wrong from then on; its blocks'
/// two other holders outvote it (so they are never killed), and the
/// campaign expects it caught. For training, a 2x2 elastic job with
/// checkpoints and `faults` faults at random steps, each a kill, a stop
/// (SIGSTOP) or a hang (its stage stalls, its node stays up) of a random
/// rank (at most 3 in all), a random rank's link throttled for three
/// steps, a worker joining (at most 2), or a message a random rank loses
/// (`any`: an activation, a gradient or a reduce-scatter piece, whichever
/// it receives in the grid of that moment: a deadlock the coordinator's
/// stall check must find, `--hang-s 3`).
fl::scenario random_scenario(const faultlab_args& a, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const model_config cfg = model_config_of(a.model);
  std::ostringstream t;
  t << "name = \"random " << (a.swarm ? "swarm" : "train") << " campaign\"\nseed = " << seed << "\n";
  if (a.swarm) {
    const int n = cfg.n_layers, half = std::max(1, n / 2);
    const int tokens = 24;
    std::uniform_int_distribution<int> at(2, tokens - 2);
    const bool wrong = a.faults > 0 && std::uniform_int_distribution<int>(0, 2)(rng) == 0;
    const std::string first = "\"0:" + std::to_string(half) + "\"", second = "\"" + std::to_string(half) + ":" +
                                                                           std::to_string(n) + "\"";
    // Who holds each half: a kill must leave every block a server (and,
    // with a wrong server, leave its two honest peers alone).
    std::vector<std::set<int>> holders;
    std::set<int> protect;
    int servers = 0, made = 0;
    if (wrong) {
      servers = 6;  // even: [0, half), odd: [half, n)
      t << "[swarm]\nmodel = " << toml_quoted(a.model) << "\nservers = [" << first << ", " << second << ", " << first
        << ", " << second << ", " << first << ", " << second << "]\n";
      holders = {{0, 2, 4}, {1, 3, 5}};
      protect = holders[0];
      t << "[swarm.client]\nprompt_ids = [1, 2, 3]\nnew_tokens = " << tokens
        << "\nspot_checks = 1.0\nspot_check_probation = 0\n";
      t << "[[fault]]\nat = \"token " << at(rng) << "\"\ndo = \"corrupt\"\ntarget = \"route.hop 0\"\n";
      ++made;
    } else {
      servers = 5;
      t << "[swarm]\nmodel = " << toml_quoted(a.model) << "\nservers = [" << first << ", " << second << ", \"0:" << n
        << "\", " << first << ", " << second << "]\n";
      holders = {{0, 2, 3}, {1, 2, 4}};
      t << "[swarm.client]\nprompt_ids = [1, 2, 3]\nnew_tokens = " << tokens << "\n";
    }
    std::vector<int> order(static_cast<std::size_t>(servers));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::set<int> dead;
    auto covered = [&](const std::set<int>& d) {
      for (const std::set<int>& h : holders)
        if (std::all_of(h.begin(), h.end(), [&](int s) { return d.count(s) > 0; })) return false;
      return true;
    };
    for (int k : order) {
      if (made >= a.faults) break;
      std::set<int> next = dead;
      next.insert(k);
      if (protect.count(k) || !covered(next)) continue;
      dead = next;
      // A partitioned server is as lost to the client as a killed one.
      const char* how = std::uniform_int_distribution<int>(0, 1)(rng) ? "partition" : "kill";
      t << "[[fault]]\nat = \"token " << at(rng) << "\"\ndo = \"" << how << "\"\ntarget = \"server " << k << "\"\n";
      ++made;
    }
    // A slow uplink on a random server for a while: it must not change the output.
    static const char* profiles[] = {"bw=5Mbit,lat=10ms", "bw=50Mbit,lat=2ms", "lat=20ms,jitter=5ms"};
    std::uniform_int_distribution<int> which(0, 2), server(0, servers - 1);
    const int slow = server(rng);
    const int from = at(rng);
    t << "[[fault]]\nat = \"token " << from << "\"\ndo = \"throttle\"\ntarget = \"server " << slow
      << "\"\nprofile = \"" << profiles[which(rng)] << "\"\n";
    t << "[[fault]]\nat = \"token " << std::min(tokens - 1, from + 4) << "\"\ndo = \"heal\"\ntarget = \"server " << slow
      << "\"\n";
    // A heal of a server killed before it is skipped: allowed here.
    t << "[expect]\nsame_output_as_reference = true\nmax_stall_s = 30\nevery_fault_hits = false\n";
    if (wrong) t << "wrong_servers_caught = true\n";
  } else {
    if (a.data.empty()) throw std::invalid_argument("faultlab random --train needs --data FILE");
    const int steps = 24;
    t << "[train]\nmodel = " << toml_quoted(a.model) << "\ndata = " << toml_quoted(a.data) << "\nargs = \"--batch 12 --seq 8 --steps "
      << steps << " --lr 0.003 --threads 1 --link-profile lat=2ms --hang-s 3\"\nlayout = \"--pp 2 --dp 2\"\nelastic = true\n"
      << "checkpoint_every = 3\n";
    // kill, stop, throttle, join, hang, lose
    std::uniform_int_distribution<int> at(2, steps - 4), kind(0, 5);
    static const char* profiles[] = {"bw=20Mbit,lat=4ms", "lat=10ms,jitter=2ms"};
    static const char* kills[] = {"kill", "stop", "", "", "hang"};
    int lost = 0, joins = 0;
    for (int k = 0; k < a.faults; ++k) {
      int what = kind(rng);
      if (what == 3 && joins >= 2) what = 0;
      const bool loses_rank = what <= 1 || what == 4;
      if (loses_rank && lost >= 3) what = 2;  // at least one of the first four ranks stays
      const int when = at(rng);
      if (what <= 1 || what == 4) {
        // A kill, a stop (SIGSTOP) or a hung stage the launcher must notice.
        t << "[[fault]]\nat = \"step " << when << "\"\ndo = \"" << kills[what] << "\"\ntarget = \"random rank\"\n";
        ++lost;
      } else if (what == 5) {
        // A message lost with every rank up: the ranks wait on each other.
        t << "[[fault]]\nat = \"step " << when << "\"\ndo = \"lose\"\ntarget = \"random rank\"\nmessage = \"any\"\n";
      } else if (what == 2) {
        // A slow link for three steps: the losses must not change.
        t << "[[fault]]\nat = \"step " << when << "\"\ndo = \"throttle\"\ntarget = \"random rank\"\nprofile = \""
          << profiles[std::uniform_int_distribution<int>(0, 1)(rng)] << "\"\n";
        t << "[[fault]]\nat = \"step " << when + 3 << "\"\ndo = \"heal\"\ntarget = \"random rank\"\n";
      } else {
        // A worker offers itself (corolla train --join): used when growing pays.
        t << "[[fault]]\nat = \"step " << when << "\"\ndo = \"join\"\n";
        ++joins;
      }
    }
    t << "[expect]\nsame_losses_as_reference = true\nmax_stall_s = 60\nevery_fault_hits = false\n";
  }
  return fl::parse_scenario(t.str(), "random campaign (seed " + std::to_string(seed) + ")");
}

}  // namespace

void register_faultlab(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<faultlab_args>();
  auto* cmd = app.add_subcommand("faultlab", "Fault injection against real local swarms and training jobs");
  cmd->require_subcommand(1);
  auto* run = cmd->add_subcommand("run", "Run a scenario: the failure-free reference, then with its faults; check it");
  run->add_option("scenario", a->scenario, "Scenario TOML file (docs/faultlab.md)")->required();
  auto* random = cmd->add_subcommand("random", "Run a random campaign of kills (prints the seed to replay it)");
  random->add_flag("--swarm", a->swarm, "A swarm campaign (needs --model)");
  random->add_flag("--train", a->train, "A training campaign (needs --model and --data)");
  random->add_option("--model", a->model, "HuggingFace model directory")->required();
  random->add_option("--data", a->data, "Training tokens (with --train)");
  random->add_option("--faults", a->faults, "Faults to inject (at most 10: a campaign is 24 steps or tokens)")
      ->check(integer_between(1, 10))
      ->capture_default_str();
  for (CLI::App* c : {run, random}) {
    c->add_flag("--json", a->json_out, "One JSON report on stdout");
    c->add_option("--report", a->report, "Write report.json and every process's log here")
        ->check(non_empty());
    c->add_option("--seed", a->seed, "Seed of random targets (default: the scenario's; random: the time)")
        ->check(integer_between(0, std::numeric_limits<long long>::max()));
  }
  run->callback([a, &action] {
    action = [a] {
      apply_common_options(1, "warn");
      if (!a->report.empty()) check_output_dir(a->report, "--report");
      a->replay = "corolla faultlab run " + shell_word(a->scenario);
      return run_scenario(fl::parse_scenario(read_whole_file(a->scenario, "scenario"), a->scenario), *a);
    };
  });
  random->callback([a, &action] {
    action = [a] {
      apply_common_options(1, "warn");
      if (a->swarm == a->train) throw std::invalid_argument("give exactly one of --swarm and --train");
      if (a->swarm && !a->data.empty())
        throw std::invalid_argument("--data is for --train campaigns (a swarm campaign generates from its prompt)");
      if (!a->report.empty()) check_output_dir(a->report, "--report");
      const std::uint64_t seed =
          a->seed >= 0 ? static_cast<std::uint64_t>(a->seed)
                       : static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
      faultlab_args b = *a;
      b.seed = static_cast<std::int64_t>(seed);
      b.replay = std::string("corolla faultlab random ") + (a->swarm ? "--swarm" : "--train") + " --model " +
                 shell_word(a->model) + (a->train ? " --data " + shell_word(a->data) : "") + " --faults " +
                 std::to_string(a->faults);
      return run_scenario(random_scenario(b, seed), b);
    };
  });
}

}  // namespace corolla::app
