// `corolla bench serve`: concurrent sessions through the span server against
// one session, the engine's own batches in the same run, the server's
// counters (every timed step counted, batches no larger than the sessions),
// and the KV cache: at --max-memory as many whole pages as the weights
// leave, allocated up front; bad budgets and levels are one clear error.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/transformer.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using corolla::testing::check_one_error;
using corolla::testing::last_json_line;
using corolla::testing::run_corolla;

TEST_CASE("bench serve measures 1 and 3 sessions through the server and on its engine, with the cache it holds") {
  corolla::testing::temp_dir_guard dir("bench-serve");
  corolla::testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  const corolla::model_config cfg = corolla::load_config(dir.path());
  // What the server holds, counted here: every block parameter in f32, and
  // keys and values of every layer per token.
  long long weight_bytes = 0;
  corolla::transformer m = corolla::transformer::load(model, corolla::cpu_backend());
  for (const auto& b : m.blocks())
    for (const auto& e : b.entries()) weight_bytes += 4 * e.numel;
  const long long per_token = 2LL * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4;
  const long long page = 16 * per_token;
  const long long budget = weight_bytes + 100 * page + page / 2;

  auto r = run_corolla({"bench", "serve", "--model", model, "--sessions", "3", "--prompt-tokens", "4", "--new-tokens",
                        "8", "--rounds", "2", "--threads", "1", "--max-memory", std::to_string(budget), "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = last_json_line(r.out);
  CHECK(j["bench"] == "serve");
  CHECK(j["blocks"] == cfg.n_layers);
  const auto& kv = j["kv_cache"];
  CHECK(kv["from"] == "--max-memory");
  CHECK(kv["weight_bytes"].get<long long>() == weight_bytes);
  CHECK(kv["bytes_per_token"].get<long long>() == per_token);
  CHECK(kv["tokens"].get<long long>() == 100 * 16);
  CHECK(kv["bytes"].get<long long>() == 100 * page);
  CHECK(kv["allocated_up_front"].get<bool>());
  // One session is always measured, first; 3 after it.
  const auto& levels = j["levels"];
  REQUIRE(levels.size() == 2);
  for (int i = 0; i < 2; ++i) {
    const auto& l = levels[static_cast<std::size_t>(i)];
    const int s = l["sessions"].get<int>();
    CHECK(s == (i == 0 ? 1 : 3));
    CHECK(l["server_tokens_per_s"].get<double>() > 0);
    CHECK(l["engine_tokens_per_s"].get<double>() > 0);
    // Every timed step of both rounds, in batches of at most `s` steps.
    const auto steps = l["server_decode_steps"].get<long long>();
    const auto batches = l["server_batches"].get<long long>();
    CHECK(steps == s * 8 * 2);
    CHECK(batches * s >= steps);
    CHECK(batches <= steps);
    CHECK(l["mean_batch"].get<double>() == doctest::Approx(static_cast<double>(steps) / batches));
    CHECK(l["step_ms_p50"].get<double>() > 0);
    CHECK(l["step_ms_p90"].get<double>() >= l["step_ms_p50"].get<double>());
  }
  CHECK(levels[0]["server_vs_one_session"].get<double>() == 1.0);
  CHECK(levels[0]["mean_batch"].get<double>() == 1.0);
  CHECK(j["aggregate_vs_one_session"].get<double>() == levels[1]["server_vs_one_session"].get<double>());
  CHECK(j["sessions"] == 3);
  CHECK(j["bandwidth_bound_tokens_per_s"].get<double>() > 0);
  CHECK(j["one_session_vs_bound"].get<double>() > 0);
}

TEST_CASE("bench serve --max-memory auto on the cpu gives the cache what half the host's available memory leaves") {
  corolla::testing::temp_dir_guard dir("bench-serve-auto");
  corolla::testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  auto r = run_corolla({"bench", "serve", "--model", model, "--sessions", "1", "--prompt-tokens", "4", "--new-tokens",
                        "2", "--rounds", "1", "--threads", "1", "--max-memory", "auto", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = last_json_line(r.out);
  const auto& kv = j["kv_cache"];
  long long total = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    in >> key >> total;  // MemTotal comes first, in kB
    REQUIRE(key == "MemTotal:");
    total *= 1024;
  }
  const long long budget = kv["max_memory_bytes"].get<long long>();
  CHECK(budget > 0);
  CHECK(budget <= total / 2);
  const long long page = 16 * kv["bytes_per_token"].get<long long>();
  CHECK(kv["tokens"].get<long long>() == (budget - kv["weight_bytes"].get<long long>()) / page * 16);
}

TEST_CASE("bench serve --link-profile: every step waits for the link, and the bound counts it") {
  corolla::testing::temp_dir_guard dir("bench-serve-link");
  corolla::testing::write_tiny_model(dir.path(), {});
  auto r = run_corolla({"bench", "serve", "--model", dir.path().string(), "--sessions", "1,3", "--prompt-tokens", "4",
                        "--new-tokens", "4", "--rounds", "1", "--threads", "1", "--link-profile", "lat=5ms",
                        "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = last_json_line(r.out);
  CHECK(j["link"].get<std::string>().find("5 ms one-way") != std::string::npos);
  CHECK(j["link_ms_per_step"].get<double>() == doctest::Approx(10.0));
  for (const auto& l : j["levels"]) {
    // 5 ms each way: no step is quicker than the round trip.
    CHECK(l["step_ms_p50"].get<double>() >= 10.0);
    const double engine = l["engine_tokens_per_s"].get<double>();
    const double sessions = l["sessions"].get<double>();
    CHECK(l["link_bound_tokens_per_s"].get<double>() == doctest::Approx(sessions / (0.010 + sessions / engine)));
    CHECK(l["server_vs_link_bound"].get<double>() > 0);
  }
  // Unshaped, the bound is the engine's own rate; --batch-wait 0 reaches
  // the server: no batch waits for late sessions.
  auto plain = run_corolla({"bench", "serve", "--model", dir.path().string(), "--sessions", "1,3", "--prompt-tokens",
                            "4", "--new-tokens", "2", "--rounds", "1", "--threads", "1", "--batch-wait", "0", "--json"});
  REQUIRE(plain.exit_code == 0);
  const auto p = last_json_line(plain.out);
  CHECK(p["batch_wait"].get<double>() == 0.0);
  for (const auto& l : p["levels"]) CHECK(l["server_decode_waits"].get<long long>() == 0);
  CHECK(p["link_ms_per_step"].get<double>() == 0.0);
  CHECK(p["levels"][0]["link_bound_tokens_per_s"].get<double>() ==
        doctest::Approx(p["levels"][0]["engine_tokens_per_s"].get<double>()));
}

TEST_CASE("bench serve: a budget without room for a page, a cache too small for the sessions, bad levels") {
  corolla::testing::temp_dir_guard dir("bench-serve-errors");
  corolla::testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  const std::vector<std::string> base{"bench", "serve", "--model", model, "--prompt-tokens", "4", "--new-tokens", "8",
                                      "--rounds", "1", "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_corolla(a);
  };
  check_one_error(with({"--max-memory", "1KiB"}), "--max-memory 1KiB leaves no room for a page of KV cache (0.004 MiB) after the weights (");
  check_one_error(with({"--cache-tokens", "16", "--sessions", "4"}),
                  "the KV cache holds 16 tokens; 4 sessions of 14 tokens need 64");
  check_one_error(with({"--sessions", "0"}), "--sessions takes levels from 1 to 256");
  // The op profile is bench decode's and bench train's: not a flag here.
  const corolla::testing::process_result profile = with({"--profile"});
  REQUIRE(profile.exited());
  CHECK(profile.exit_code == 109);  // CLI11's unexpected argument
  CHECK(profile.err.find("--profile") != std::string::npos);
  check_one_error(with({"--link-profile", "bogus"}), "link profile: 'bogus': unknown profile");
  check_one_error(with({"--batch-wait", "-0.5"}), "--batch-wait must be a fraction >= 0 of the last batch's time");
  check_one_error(with({"--batch-wait-max-ms", "20000"}), "--batch-wait-max-ms must be between 0 and 10000");
}
