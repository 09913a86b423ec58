// Swarm servers in the DHT, with real `corolla serve` processes on
// 127.0.0.1: servers announce themselves (spans, RTTs to the next servers,
// throughput) and a client finds them through any one of them; servers given
// only a block count or a memory budget place themselves where the swarm is
// weakest, and one moves to the blocks a crashed server left uncovered; a
// server that requires CurveZMQ has its key read from the DHT and serves
// only the clients it allows.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/span_engine.hpp"
#include "net/membership.hpp"
#include "net/zmq_transport.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/process.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/tiny_model.hpp"

using namespace std::chrono_literals;
using corolla::testing::child_process;

namespace corolla {
using namespace swarm_test;

TEST_CASE("servers announce themselves in the DHT and a client finds them through any one of them") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2, {"--dht", "--dht-ttl-s", "5"});
  const std::string first = sw.dht.at("s-a");
  REQUIRE_FALSE(first.empty());
  sw.start(m, "s-b", 2, 4, {"--initial-peers", first, "--dht-ttl-s", "5"});
  sw.start(m, "s-c", 1, 3, {"--initial-peers", first, "--dht-ttl-s", "5"});
  // s-d's link carries 1 Mbit/s: its announced throughput is what the link
  // carries, 1e6 / (32 floats x 32 bits) = 976.6 hidden states per second.
  sw.start(m, "s-d", 2, 4, {"--initial-peers", first, "--dht-ttl-s", "5", "--link-profile", "bw=1Mbit,lat=0ms"});
  // The client knows one DHT node (s-b's) and no server endpoint.
  auto remote = generate_cli(m, {"--swarm-dht", sw.dht.at("s-b"), "--log-level", "info"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
  MESSAGE("client log:\n" << remote.err);
  CHECK(remote.err.find("swarm route:") != std::string::npos);

  // s-a's record carries its measured RTTs to the servers of block 2 (s-b
  // and s-c), for routing between consecutive servers.
  net::membership reader;
  net::membership_options mo;
  mo.bootstrap = {first};
  mo.ttl = 5s;
  REQUIRE(reader.start(mo));
  const std::string model = m.dir.path().filename().string();
  std::map<std::string, double> rtts;
  testing::eventually(
      [&] {
        for (const auto& r : reader.get_span(model, 0, 1))
          if (r.node_id == "s-a") rtts = r.rtt_ms;
        return rtts.count("s-b") && rtts.count("s-c");
      },
      15s, 200ms);
  CHECK(rtts.count("s-b") == 1);
  CHECK(rtts.count("s-c") == 1);
  bool found_d = false;
  for (const auto& r : reader.get_span(model, 2, 3))
    if (r.node_id == "s-d") {
      found_d = true;
      CHECK(r.throughput == doctest::Approx(1e6 / (32.0 * 32.0)).epsilon(1e-6));
    }
  CHECK(found_d);
  for (const auto& [id, ms] : rtts) {
    MESSAGE("s-a -> " << id << ": " << ms << " ms");
    CHECK(ms > 0.0);
    CHECK(ms < 5000.0);  // loopback (the first heartbeat, taken while five processes start, may be slow)
  }
  // span.info announces the same RTTs, and a client routes on them between
  // consecutive servers (which push to each other).
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  swarm_client client(*n, o);
  REQUIRE_FALSE(client.refresh());
  const auto* a = client.server("s-a");
  REQUIRE(a != nullptr);
  CHECK(a->info.rtt_ms.count("s-b") == 1);
  CHECK(a->info.rtt_ms.count("s-c") == 1);
  for (const auto& r : client.state().servers)
    if (r.id == "s-a") CHECK(r.rtt_s.count("s-b") == 1);
}

TEST_CASE("servers given only a block count place themselves where the swarm is weakest") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  auto start = [&](const std::string& id, const std::string& peers) {
    std::vector<std::string> extra{"--dht", "--dht-ttl-s", "5"};
    if (!peers.empty()) extra.insert(extra.end(), {"--initial-peers", peers});
    // The span comes from the DHT, not from the command line: --blocks is
    // replaced by --num-blocks below.
    extra.insert(extra.end(), {"--num-blocks", "2"});
    sw.start(m, id, -1, -1, extra);
  };
  start("s-1", "");
  start("s-2", sw.dht.at("s-1"));  // the gap [2, 4)
  start("s-3", sw.dht.at("s-1"));  // the weaker of the two covered windows
  CHECK(sw.spans.at("s-1") == std::make_pair(0, 2));
  CHECK(sw.spans.at("s-2") == std::make_pair(2, 4));
  const auto s3 = sw.spans.at("s-3");
  CHECK((s3 == std::make_pair(0, 2) || s3 == std::make_pair(2, 4)));
  MESSAGE("s-3 chose [" << s3.first << ", " << s3.second << ")");
  auto remote = generate_cli(m, {"--swarm-dht", sw.dht.at("s-3")});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
}

TEST_CASE("a server given --max-memory serves as many blocks as fit, where the swarm is weakest") {
  swarm_model m(architecture::llama);
  const model_config cfg = load_config(m.dir.path().string());
  // One f32 block set aside (loading, fine-tuning requests), then two
  // blocks' weights (int8 copies, norms: the f32 parameters are not kept)
  // and KV cache for 512 tokens, and half of a third.
  const std::int64_t per_block = served_block_bytes(cfg, weight_format::int8, false) +
                                 static_cast<std::int64_t>(span_engine::kv_bytes_per_token(cfg, 1)) * 512;
  const std::string budget = std::to_string(served_block_bytes(cfg, weight_format::f32) + per_block * 5 / 2);
  swarm_processes sw;
  sw.start(m, "s-1", -1, -1,
           {"--dht", "--dht-ttl-s", "5", "--weights", "int8", "--cache-tokens", "512", "--max-memory", budget,
            "--log-level", "info"});
  CHECK(sw.spans.at("s-1").second - sw.spans.at("s-1").first == 2);
  // The KV cache gets what the two blocks' weights leave, in whole pages of
  // 16 tokens: more than the 512 tokens they were counted with.
  const std::int64_t kv_token = static_cast<std::int64_t>(span_engine::kv_bytes_per_token(cfg, 2));
  const std::int64_t left = std::stoll(budget) - served_block_bytes(cfg, weight_format::f32) -
                            2 * served_block_bytes(cfg, weight_format::int8, false);
  const std::int64_t tokens = left / (kv_token * 16) * 16;
  REQUIRE(tokens > 512);
  const std::regex cache_line(R"(KV cache for (\d+) tokens)");
  std::smatch got;
  std::string err;
  for (int tries = 0; tries < 200; ++tries) {  // the line follows the readiness line on stderr
    err = sw.procs.at("s-1").err();
    if (std::regex_search(err, got, cache_line)) break;
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE_MESSAGE(!got.empty(), "s-1 logged no KV cache size:\n" << sw.procs.at("s-1").err());
  CHECK(std::stoll(got[1].str()) == tokens);
  // A second server of the same size fills the gap.
  sw.start(m, "s-2", -1, -1,
           {"--initial-peers", sw.dht.at("s-1"), "--weights", "int8", "--cache-tokens", "512", "--max-memory", budget});
  CHECK(sw.spans.at("s-2") == (sw.spans.at("s-1").first == 0 ? std::make_pair(2, 4) : std::make_pair(0, 2)));
  // Given no blocks, a server takes --max-memory auto: half the host's
  // available memory holds every block of the tiny model, and the server
  // says what it read.
  sw.start(m, "s-3", -1, -1, {"--initial-peers", sw.dht.at("s-1"), "--log-level", "info"});
  CHECK(sw.spans.at("s-3") == std::make_pair(0, 4));
  CHECK_MESSAGE(sw.procs.at("s-3").err().find("--max-memory auto: ") != std::string::npos, sw.procs.at("s-3").err());
}

TEST_CASE("a server moves to the blocks a crashed server left uncovered, and clients find it there") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  const std::vector<std::string> quick{"--dht-ttl-s", "3", "--rebalance-period-s", "1000"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  sw.start(m, "s-2", 0, 2, with(quick, {"--dht"}));
  sw.start(m, "s-3", 2, 4, with(quick, {"--initial-peers", sw.dht.at("s-2")}));
  // s-1 checks about every second whether moving would help.
  sw.start(m, "s-1", 0, 2, {"--initial-peers", sw.dht.at("s-2"), "--dht-ttl-s", "3", "--rebalance-period-s", "1"});
  const auto t0 = std::chrono::steady_clock::now();
  sw.procs.at("s-3").signal(SIGKILL);  // [2, 4) loses its only server
  auto moved = sw.procs.at("s-1").wait_line(std::regex(R"(moved to blocks \[2, 4\))"), 30s);
  REQUIRE_MESSAGE(moved, "s-1 did not move to the uncovered blocks within 30 s; its log:\n" << sw.procs.at("s-1").err());
  MESSAGE("s-1 moved to [2, 4) " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                 << " s after the crash");
  auto remote = generate_cli(m, {"--swarm-dht", sw.dht.at("s-2")});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
}

TEST_CASE("a server that requires CurveZMQ serves the clients it allows, its key read from the DHT") {
  swarm_model m(architecture::llama);
  testing::temp_dir_guard keys("swarm-curve");
  const auto client = net::load_curve_dir((keys / "client").string());  // creates the key pair
  (void)net::load_curve_dir((keys / "server").string());
  (void)net::load_curve_dir((keys / "stranger").string());
  {
    std::ofstream allowed(keys / "server" / "allowed", std::ios::app);
    allowed << client.public_key << "\n";
  }
  swarm_processes sw;
  sw.start(m, "s-secure", 0, 4, {"--dht", "--curve-keys", (keys / "server").string()});
  const std::string dht = sw.dht.at("s-secure");
  auto allowed_run = generate_cli(m, {"--swarm-dht", dht, "--curve-keys", (keys / "client").string()});
  REQUIRE_MESSAGE(allowed_run.exit_code == 0, allowed_run.err);
  CHECK(printed_ids(allowed_run) == m.expected);
  // A key the server does not allow gets no service, and a clear error.
  auto refused = generate_cli(m, {"--swarm-dht", dht, "--curve-keys", (keys / "stranger").string()});
  CHECK(refused.exit_code == 1);
  REQUIRE_FALSE(refused.err_lines().empty());
  MESSAGE("not allowed: " << refused.err_lines().back());
  CHECK(refused.err_lines().back().find("corolla: error:") == 0);
}

}  // namespace corolla
