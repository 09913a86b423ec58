// Swarm serving with real `corolla serve` processes on 127.0.0.1: remote
// generation equals local generation for several layouts (also through
// `corolla generate --swarm`, on bf16 weights, and with int8 hidden states
// on the wire), a new session sees servers that joined since the last
// refresh; bad requests get clear errors while the server keeps serving;
// `corolla bench swarm` runs every part. Failures mid-generation are in
// mp_swarm_failover.cpp, the DHT and placement in mp_swarm_dht.cpp.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "actors/swarm_wire.hpp"
#include "model/config.hpp"
#include "model/generator.hpp"
#include "net/zmq_transport.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/process.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/tiny_model.hpp"

using namespace std::chrono_literals;
using corolla::testing::child_process;

namespace corolla {
using namespace swarm_test;

TEST_CASE("swarm greedy generation equals local generation for several server layouts") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    swarm_model m(arch);
    struct layout {
      const char* name;
      std::vector<std::tuple<std::string, int, int>> servers;
    };
    for (const layout& l : {layout{"one server", {{"s-all", 0, 4}}},
                            layout{"three consecutive spans", {{"s-a", 0, 1}, {"s-b", 1, 3}, {"s-c", 3, 4}}},
                            layout{"overlapping spans with redundancy",
                                   {{"s-a", 0, 3}, {"s-b", 2, 4}, {"s-c", 0, 2}, {"s-d", 1, 4}}}}) {
      const std::string layout_name = std::string(l.name) + (arch == architecture::llama ? ", llama" : ", gpt2");
      CAPTURE(layout_name);
      swarm_processes sw;
      for (const auto& [id, a, b] : l.servers) sw.start(m, id, a, b);
      auto n = client_node();
      swarm_client_options o;
      o.servers = sw.list();
      std::vector<std::string> events;
      o.on_event = [&](const std::string& e) { events.push_back(e); };
      swarm_client client(*n, o);
      head h = load_head(m);
      swarm_generation g = swarm_generate(client, h, m.prompt, m.params);
      CHECK(g.result.tokens == m.expected);
      CHECK(g.failovers == 0);
      // Servers push to each other once their links are up: a server dials
      // its successor at the first step that names it, which a step or two
      // later carries pushes.
      const auto steps = static_cast<std::uint64_t>(m.params.max_new_tokens);
      const std::uint64_t inner_hops = g.route.size() - 1;
      CHECK(g.pushed_hops >= (steps - 2 * inner_hops) * inner_hops);
      CHECK(g.pushed_hops <= steps * inner_hops);
      // Once a route's pushes go through, its decode steps are posted (only
      // the last hop answers, with every hop's output).
      if (inner_hops > 0) CHECK(g.posted_steps + 2 * inner_hops + 1 >= steps);
      else CHECK(g.posted_steps == 0);
      REQUIRE_FALSE(events.empty());
      MESSAGE(layout_name << ": " << events.front() << "; " << g.pushed_hops << " hop inputs pushed server to server, "
                          << g.posted_steps << " steps posted");
      // Every hop answering its request gives the same output.
      swarm_client_options requested = o;
      requested.post_steps = false;
      swarm_client client3(*n, requested);
      swarm_generation g3 = swarm_generate(client3, h, m.prompt, m.params);
      CHECK(g3.result.tokens == m.expected);
      CHECK(g3.posted_steps == 0);
      if (inner_hops > 0) CHECK(g3.pushed_hops > 0);
      // The client carrying every hop itself gives the same output.
      swarm_client_options carried = o;
      carried.server_push = false;
      swarm_client client2(*n, carried);
      swarm_generation g2 = swarm_generate(client2, h, m.prompt, m.params);
      CHECK(g2.result.tokens == m.expected);
      CHECK(g2.pushed_hops == 0);
    }
  }
}

TEST_CASE("a new session sees servers that joined since the last refresh") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-first", 0, 4);
  auto n = client_node();
  std::vector<std::string> announced = sw.list();  // what a DHT would return
  swarm_client_options o;
  o.discover = [&] { return announced; };
  o.refresh_period = 1500ms;
  swarm_client client(*n, o);
  const auto first_refresh = std::chrono::steady_clock::now();
  {
    auto s = client.open_session(32);
    REQUIRE_MESSAGE(s, error_message(s));
  }
  CHECK(client.servers().size() == 1u);
  sw.start(m, "s-joined", 0, 4);
  announced = sw.list();
  if (std::chrono::steady_clock::now() - first_refresh < 1200ms) {
    auto s = client.open_session(32);  // within the period: the old view
    REQUIRE(s);
    CHECK(client.servers().size() == 1u);
  }
  std::this_thread::sleep_until(first_refresh + 1600ms);
  {
    auto s = client.open_session(32);  // past the period: refreshed first
    REQUIRE(s);
  }
  REQUIRE(client.servers().size() == 2u);
  for (const known_server& k : client.servers()) CHECK(k.reachable);
}

TEST_CASE("corolla generate --swarm prints the same ids as local corolla generate") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  std::string list;
  for (const auto& e : sw.list()) list += (list.empty() ? "" : ",") + e.substr(6);  // HOST:PORT form
  auto local = generate_cli(m);
  REQUIRE_MESSAGE(local.exit_code == 0, local.err);
  CHECK(printed_ids(local) == m.expected);
  auto remote = generate_cli(m, {"--swarm", list});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(remote.out_lines().back() == local.out_lines().back());
  // The client carrying every hop itself prints the same ids.
  auto carried = generate_cli(m, {"--swarm", list, "--no-server-push"});
  REQUIRE_MESSAGE(carried.exit_code == 0, carried.err);
  CHECK(carried.out_lines().back() == local.out_lines().back());

  // A swarm that is not there is one clear error line.
  auto none = testing::run_corolla({"generate", "--model", m.dir.path().string(), "--prompt-ids", "1,2", "--swarm",
                                    "127.0.0.1:1"},
                                   60s);
  CHECK(none.exit_code == 1);
  REQUIRE_FALSE(none.err_lines().empty());
  CHECK(none.err_lines().back().find("corolla: error:") == 0);
  MESSAGE(none.err_lines().back());
}

TEST_CASE("servers and client on bf16 weights generate through the swarm what local --weights bf16 generates") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2, {"--weights", "bf16"});
  sw.start(m, "s-b", 2, 4, {"--weights", "bf16"});
  std::string list;
  for (const auto& e : sw.list()) list += (list.empty() ? "" : ",") + e.substr(6);
  auto local = generate_cli(m, {"--weights", "bf16"});
  REQUIRE_MESSAGE(local.exit_code == 0, local.err);
  auto remote = generate_cli(m, {"--swarm", list, "--weights", "bf16"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(remote.out_lines().back() == local.out_lines().back());
  MESSAGE("bf16 ids: " << local.out_lines().back() << " (f32 model: " << m.expected.size() << " ids expected)");
  // A bad value is one clear error from serve.
  auto bad = testing::run_corolla({"serve", "--model", m.dir.path().string(), "--blocks", "0:1", "--no-dht",
                                   "--weights", "int4"},
                                  30s);
  CHECK(bad.exit_code == 1);
  REQUIRE_FALSE(bad.err_lines().empty());
  CHECK(bad.err_lines().back().find("--weights must be f32, bf16, int8 or nf4") != std::string::npos);
}

TEST_CASE("int8 compression of hidden states cuts the bytes on the wire and still generates") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  auto bytes_received = [&](bool compress, std::vector<std::int32_t>& tokens) {
    auto n = client_node();
    swarm_client_options o;
    o.servers = sw.list();
    o.compress = compress;
    swarm_client client(*n, o);
    head h = load_head(m);
    tokens = swarm_generate(client, h, m.prompt, m.params).result.tokens;
    std::uint64_t bytes = 0;  // payload bytes as they travelled (link_stats)
    for (const auto& peer : n->peers())
      if (auto st = n->stats(peer)) bytes += st->bytes_received;
    return bytes;
  };
  std::vector<std::int32_t> exact, compressed;
  const auto raw_bytes = bytes_received(false, exact);
  const auto int8_bytes = bytes_received(true, compressed);
  MESSAGE("hidden-state bytes received: " << raw_bytes << " raw, " << int8_bytes << " int8");
  CHECK(exact == m.expected);
  CHECK(compressed.size() == m.expected.size());
  // A 32-float row is 128 bytes raw and 36 as int8 (values and one scale);
  // answers' bodies (span.info, span.open) do not shrink.
  CHECK(int8_bytes * 2 < raw_bytes);
  std::size_t same = 0;
  while (same < compressed.size() && compressed[same] == m.expected[same]) ++same;
  MESSAGE("int8 output agrees with local for the first " << same << " of " << compressed.size() << " tokens");
}

TEST_CASE("a span server answers bad requests with clear errors and keeps serving") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-bad", 0, 4, {"--cache-tokens", "32"});
  auto n = client_node();
  auto peer = n->connect(sw.endpoints.at("s-bad"));
  REQUIRE(peer);
  auto ask = [&](const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {}) {
    remote_message r;
    r.type = type;
    r.body = std::move(body);
    r.tensors = std::move(tensors);
    return n->request(*peer, "span", std::move(r), 10s);
  };
  const std::int64_t D = m.cfg.hidden_size;
  auto rows = [&](std::int64_t k, dtype t = dtype::f32) { return Tensor::zeros({k, D}, t); };
  auto code_of = [](const caf::expected<remote_message>& r) { return r ? std::string("(ok)") : error_code(r.error()); };

  REQUIRE(ask(span_request::open, encode_body(span_open{"good", 16})));
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"nobody", 0, 1}), {rows(1)})) == "unknown_session");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 5, 1}), {rows(1)})) == "bad_position");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 0, 1}), {Tensor::zeros({1, D + 1})})) ==
        "invalid_argument");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 0, 1}), {rows(1, dtype::i32)})) ==
        "invalid_argument");
  CHECK(code_of(ask(span_request::step, {1, 2, 3}, {rows(1)})) == "bad_message");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 0, 1}), {})) == "bad_message");
  CHECK(code_of(ask("span.nonsense", {})) == "bad_message");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"good", 16}))) == "duplicate_session");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"huge", 1000}))) == "invalid_argument");
  // Deep prompts: the flag and the tensor go together, and the shape must fit the session's blocks.
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p1", 16, -1, -1, true}))) == "bad_message");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p2", 16}), {Tensor::zeros({4, 2, D})})) ==
        "bad_message");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p3", 16, -1, -1, true}), {Tensor::zeros({3, 2, D})})) ==
        "invalid_argument");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p4", 2, -1, -1, true}), {Tensor::zeros({4, 2, D})})) ==
        "invalid_argument");
  // A full cache fails the step and spares the other session.
  REQUIRE(ask(span_request::open, encode_body(span_open{"greedy", 64})));
  auto full = ask(span_request::step, encode_body(span_step{"greedy", 0, 1}), {rows(40)});
  CHECK(code_of(full) == "cache_full");
  if (!full) MESSAGE("full cache: " << error_message(full.error()));
  // The good session still works, step by step.
  for (int pos = 0; pos < 4; ++pos) {
    auto r = ask(span_request::step, encode_body(span_step{"good", pos, static_cast<std::uint64_t>(pos + 1)}), {rows(1)});
    REQUIRE_MESSAGE(r, error_message(r));
    CHECK(r->tensors.at(0).shape() == shape_t{1, D});
  }
  auto info = ask(span_request::info, {});
  REQUIRE(info);
  auto decoded = decode_span_info(info->body);
  REQUIRE(decoded);
  CHECK(decoded->first == 0);
  CHECK(decoded->last == 4);
  CHECK(decoded->sessions == 2);
  CHECK(ask(span_request::close, encode_close_body("good")));
  CHECK(code_of(ask(span_request::close, encode_close_body("good"))) == "unknown_session");
}

TEST_CASE("corolla bench swarm runs every part on a tiny model and reports push, fine-tuning, recovery and the per-hop overhead") {
  testing::temp_dir_guard dir("bench-swarm");
  testing::tiny_model_options o;
  o.layers = 4;
  o.max_positions = 128;  // the prompt-tuning part runs P + T = 72 positions
  testing::write_tiny_model(dir.path(), o);
  auto r = testing::run_corolla({"bench", "swarm", "--model", dir.path().string(), "--new-tokens", "8",
                                 "--wan-new-tokens", "4", "--tune-steps", "1", "--wan-profiles", "bw=100Mbit,lat=5ms",
                                 "--server-threads", "1", "--json"},
                                180s);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  REQUIRE_FALSE(r.out_lines().empty());
  const auto j = nlohmann::json::parse(r.out_lines().back());
  MESSAGE(j.dump());
  CHECK(j["lan"]["equal_to_local"] == true);
  CHECK(j["lan"]["pushed_hops"].get<int>() > 0);
  CHECK(j["lan"]["client_carried_steps_per_s"].get<double>() > 0);
  REQUIRE(j["wan"].size() == 1u);
  CHECK(j["wan"][0]["equal_to_local_prefix"] == true);
  CHECK(j["wan"][0]["pushed_hops"].get<int>() > 0);
  CHECK(j["wan"][0]["push_speedup"].get<double>() > 0);
  CHECK(j["finetune"]["ratio_to_local"].get<double>() > 0);
  CHECK(j["recovery"]["failovers"].get<int>() >= 1);
  CHECK(j["recovery"]["equal_to_local"] == true);
  // The fixed cost of a hop, measured on a model of its own.
  CHECK(j["hop_overhead"]["equal_to_local"] == true);
  CHECK(j["hop_overhead"]["local_ms_per_step"].get<double>() > 0);
  CHECK(j["hop_overhead"]["two_servers_ms_per_step"].get<double>() > 0);
  CHECK(j["hop_overhead"].contains("ms_per_extra_hop"));
  CHECK(j["hop_overhead"]["rounds"].get<int>() >= 5);
  CHECK(j["hop_overhead"]["ms_per_extra_hop_min"].get<double>() <= j["hop_overhead"]["ms_per_extra_hop_max"].get<double>());
  // Through a server behind NAT, reached over a relay (its output is in equal_to_local too).
  CHECK(j["hop_overhead"]["relayed_server_ms_per_step"].get<double>() > 0);
  CHECK(j["hop_overhead"].contains("ms_per_relay_leg"));
}

}  // namespace corolla
