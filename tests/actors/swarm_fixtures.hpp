// tests/actors/swarm_fixtures.hpp — `corolla serve` processes on 127.0.0.1
// and a tiny model with its local greedy generation, for the multi-process
// swarm tests (mp_swarm*.cpp).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/lora.hpp"
#include "model/safetensors.hpp"
#include "model/transformer.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/random_lora.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla::swarm_test {

using namespace std::chrono_literals;
using corolla::testing::child_process;

/// A tiny model on disk with its local greedy generation as the reference.
struct swarm_model {
  testing::temp_dir_guard dir{"swarm"};
  testing::tiny_model_options opts;
  model_config cfg;
  std::vector<std::int32_t> prompt{3, 17, 9, 41, 5};
  generation_params params;
  std::vector<std::int32_t> expected;

  /// `tweak` adjusts the model before it is written (a family, RoPE scaling).
  explicit swarm_model(architecture arch, const std::function<void(testing::tiny_model_options&)>& tweak = {}) {
    opts.arch = arch;
    opts.layers = 4;
    opts.vocab = 64;
    opts.max_positions = 64;
    if (tweak) tweak(opts);
    testing::write_tiny_model(dir.path(), opts);
    cfg = testing::tiny_config(opts);
    params.max_new_tokens = 20;
    params.ignore_eos = true;
    transformer local = transformer::load(dir.path(), cpu_backend());
    generator gen(local);
    expected = gen.generate(prompt, params).tokens;
  }
};

/// `corolla serve` processes by node id.
struct swarm_processes {
  std::map<std::string, child_process> procs;
  std::map<std::string, std::string> endpoints;
  std::map<std::string, std::string> dht;  ///< the DHT address each printed ("" with --no-dht)
  std::map<std::string, std::pair<int, int>> spans;  ///< the blocks each serves
  /// The relay a server behind NAT is reached through ("" = listens);
  /// its endpoints entry is then "ID@RELAY_ENDPOINT" (a client's form).
  std::map<std::string, std::string> relays;

  void start(const swarm_model& m, const std::string& id, int first, int last,
             std::vector<std::string> extra = {}, const std::string& listen = "tcp://127.0.0.1:0") {
    std::vector<std::string> args{"serve", "--model", m.dir.path().string(), "--node-id", id, "--listen",
                                  listen,  "--threads", "1"};
    if (std::find(extra.begin(), extra.end(), "--log-level") == extra.end()) args.insert(args.end(), {"--log-level", "warn"});
    if (first >= 0) args.insert(args.end(), {"--blocks", std::to_string(first) + ":" + std::to_string(last)});
    // Without --initial-peers a server would start a swarm of its own; tests
    // that want the DHT say so.
    if (std::find(extra.begin(), extra.end(), "--initial-peers") == extra.end() &&
        std::find(extra.begin(), extra.end(), "--dht") == extra.end())
      args.push_back("--no-dht");
    std::erase(extra, std::string("--dht"));
    args.insert(args.end(), extra.begin(), extra.end());
    child_process p = child_process::corolla(args);
    // A server behind NAT (--no-listen) names the relay it is reached through.
    auto line = p.wait_line(std::regex(R"(corolla serve (\S+) blocks \[(\d+), (\d+)\) of \S+ )"
                                       R"((?:listening on|reached through relay (\S+) at) (tcp://\S+))"),
                            45s);
    REQUIRE_MESSAGE(line, "corolla serve " << id << " printed no readiness line; stderr:\n" << p.err());
    CHECK((*line)[1].str() == id);
    relays[id] = (*line)[4].str();
    endpoints[id] = relays[id].empty() ? (*line)[5].str() : id + "@" + (*line)[5].str();
    spans[id] = {std::stoi((*line)[2].str()), std::stoi((*line)[3].str())};
    std::smatch d;
    dht[id] = std::regex_search(p.lines().back(), d, std::regex(R"( dht (\S+))")) ? d[1].str() : "";
    procs.emplace(id, std::move(p));
  }
  std::vector<std::string> list() const {
    std::vector<std::string> out;
    for (const auto& [id, e] : endpoints) out.push_back(e);
    return out;
  }
};

inline std::unique_ptr<node> client_node() {
  node_options o;
  o.listen = "";
  auto n = node::start(o);
  REQUIRE_MESSAGE(n, error_message(n));
  return std::move(*n);
}

inline head load_head(const swarm_model& m) {
  return head::load(checkpoint::open(m.dir.path()), m.cfg, cpu_backend());
}

/// `corolla generate` of m's prompt and length, greedy, plus `extra` flags.
inline testing::process_result generate_cli(const swarm_model& m, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"generate", "--model", m.dir.path().string(), "--prompt-ids", "3,17,9,41,5",
                                "--max-new-tokens", std::to_string(m.params.max_new_tokens), "--ignore-eos",
                                "--print-ids"};
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::run_corolla(args, 60s);
}

/// The ids on the last stdout line of a `generate --print-ids` run.
inline std::vector<std::int32_t> printed_ids(const testing::process_result& r) {
  std::vector<std::int32_t> ids;
  std::istringstream line(r.out_lines().empty() ? std::string() : r.out_lines().back());
  for (std::int32_t id; line >> id;) ids.push_back(id);
  return ids;
}


/// A PEFT directory `dir` holding a LoRA adapter of every linear module of
/// m's model, B drawn N(0, 0.3) so that it changes the greedy tokens.
inline void save_random_adapter(const swarm_model& m, const std::filesystem::path& dir) {
  testing::random_lora(m.cfg, 7, 0.3f).save(dir, m.dir.path().string());
}

/// Local greedy generation of m.prompt with the adapter in `dir` merged as
/// the model loads.
inline std::vector<std::int32_t> merged_tokens(const swarm_model& m, const std::filesystem::path& dir) {
  auto adapter = std::make_shared<lora_adapter>(lora_adapter::load(dir, m.cfg, cpu_backend()));
  transformer local = transformer::load(m.dir.path(), cpu_backend(), {}, adapter);
  generator gen(local);
  return gen.generate(m.prompt, m.params).tokens;
}

}  // namespace corolla::swarm_test
