// `corolla api` as a process, over a swarm of `corolla serve` processes on
// loopback: greedy text equals `corolla generate`'s (local and --swarm), a
// server killed mid-stream is replaced and the text does not change, and the
// process stops cleanly on SIGTERM.
#include <doctest/doctest.h>

#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/actors/swarm_fixtures.hpp"
#include "tests/api/api_test_util.hpp"
#include "tests/api/raw_http.hpp"
#include "tests/api/prometheus_text.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/random_lora.hpp"

using namespace corolla;
using namespace corolla::swarm_test;
using json = nlohmann::json;

namespace {

/// `corolla api` started with `args` after the common ones; returns it and
/// its port once it printed its readiness line.
std::pair<child_process, int> start_api(const std::string& model, std::vector<std::string> args) {
  std::vector<std::string> all{"api", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1", "--log-level", "info"};
  all.insert(all.end(), args.begin(), args.end());
  child_process p = child_process::corolla(all);
  auto line = p.wait_line(std::regex(R"(corolla api (\S+) listening on http://127\.0\.0\.1:(\d+))"), 30s);
  REQUIRE_MESSAGE(line, "corolla api printed no readiness line; stderr:\n" << p.err());
  const int port = std::stoi((*line)[2].str());
  return {std::move(p), port};
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

/// The servers of the last route the API's swarm client logged.
std::vector<std::string> last_route(const child_process& api) {
  const std::string err = api.err();
  const auto at = err.rfind("swarm: route ");
  if (at == std::string::npos) return {};
  const std::string line = err.substr(at, err.find('\n', at) - at);
  std::vector<std::string> out;
  static const std::regex via(R"( via (\S+))");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), via); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str());
  return out;
}

}  // namespace

TEST_CASE("corolla api over a swarm answers as corolla generate does, through a server killed mid-stream") {
  swarm_model m(architecture::llama);
  // The swarm model again, with a tokenizer and a chat template.
  testing::tiny_model_options o = m.opts;
  o.vocab = 128;
  o.max_positions = 128;
  o.sentencepiece_tokenizer = true;
  testing::write_tiny_model(m.dir.path(), o);
  const std::string model = m.dir.path().string();
  const std::string prompt = "the cat and the dog";
  const int max_tokens = 24;

  const auto local = testing::run_corolla(
      {"generate", "--model", model, "--prompt", prompt, "--max-new-tokens", std::to_string(max_tokens)}, 60s);
  REQUIRE_MESSAGE(local.exit_code == 0, local.err);
  REQUIRE(local.out.size() > 1);
  const std::string want = local.out.substr(0, local.out.size() - 1);  // generate ends the text with a newline

  // A LoRA adapter every server holds, and what local generation with it
  // merged prints.
  const auto style = m.dir.path() / "style";
  testing::random_lora(load_config(m.dir.path()), 3, 0.4f).save(style, model);
  const auto local_style = testing::run_corolla({"generate", "--model", model, "--prompt", prompt, "--max-new-tokens",
                                                 std::to_string(max_tokens), "--adapter", style.string()},
                                                60s);
  REQUIRE_MESSAGE(local_style.exit_code == 0, local_style.err);
  REQUIRE(local_style.out != local.out);

  // Each span held twice; every server's messages take 30 ms, so a
  // generation lasts long enough to lose a server in the middle of it.
  swarm_processes sw;
  for (const auto& [id, a, b] : std::vector<std::tuple<std::string, int, int>>{
           {"s-a", 0, 2}, {"s-c", 0, 2}, {"s-b", 2, 4}, {"s-d", 2, 4}})
    sw.start(m, id, a, b, {"--link-profile", "lat=30ms", "--adapter", "style=" + style.string()});
  const auto through_swarm = testing::run_corolla({"generate", "--model", model, "--prompt", prompt, "--max-new-tokens",
                                                   std::to_string(max_tokens), "--swarm", join(sw.list())},
                                                  60s);
  REQUIRE_MESSAGE(through_swarm.exit_code == 0, through_swarm.err);
  CHECK(through_swarm.out == local.out);

  // --adapter '*': the adapters the servers hold, found by asking them.
  auto [api, port] = start_api(model, {"--swarm", join(sw.list()), "--adapter", "*"});
  {
    std::string ready;
    for (const std::string& l : api.lines())
      if (l.find(" listening on ") != std::string::npos) ready = l;
    CHECK_MESSAGE(ready.ends_with(" adapters *,style"), ready);
  }
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const json body = {{"model", m.dir.path().filename().string()},
                     {"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"temperature", 0}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  REQUIRE(res);
  REQUIRE_MESSAGE(res->status == 200, res->body);
  CHECK(json::parse(res->body)["choices"][0]["text"] == want);

  // Streamed, with the route's first server killed after a few tokens.
  json streamed = body;
  streamed["stream"] = true;
  std::string raw, victim;
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = streamed.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    raw.append(data, n);
    if (++chunks == 3) {
      const auto route = last_route(api);
      REQUIRE_FALSE(route.empty());
      victim = route.front();
      sw.procs.at(victim).signal(SIGKILL);
    }
    return true;
  };
  auto streamed_res = c.send(req);
  REQUIRE(streamed_res);
  CHECK(streamed_res->status == 200);
  REQUIRE_FALSE(victim.empty());
  std::string text;
  for (std::size_t at = 0; (at = raw.find("data: {", at)) != std::string::npos;) {
    const auto end = raw.find("\n\n", at);
    const json e = json::parse(raw.substr(at + 6, end - at - 6));
    REQUIRE_MESSAGE(!e.contains("error"), e.dump());
    text += e["choices"][0]["text"].get<std::string>();
    at = end;
  }
  CHECK(raw.find("data: [DONE]\n\n") != std::string::npos);
  CHECK(text == want);
  auto metrics = c.Get("/metrics");
  REQUIRE(metrics);
  const auto samples = api::parse_prometheus_text(metrics->body);
  CHECK(samples.at("corolla_api_failovers_total") >= 1);
  MESSAGE("killed " << victim << " at chunk 3 of " << chunks << "; failovers "
                    << samples.at("corolla_api_failovers_total"));

  // A request naming the adapter the swarm holds (api --swarm --adapter
  // '*'), through the servers left: what generate --adapter prints locally.
  json adapted = body;
  adapted["model"] = "style";
  auto styled = c.Post("/v1/completions", adapted.dump(), "application/json");
  REQUIRE(styled);
  REQUIRE_MESSAGE(styled->status == 200, styled->body);
  CHECK(json::parse(styled->body)["model"] == "style");
  CHECK(json::parse(styled->body)["choices"][0]["text"] == local_style.out.substr(0, local_style.out.size() - 1));
  api.signal(SIGTERM);
  CHECK(api.wait(10s) == 0);

  // The swarm's adapter made private to one tenant (--adapter-tenants with
  // '*': the rule names an adapter found later): the other tenant neither
  // sees nor uses it.
  std::ofstream(m.dir.path() / "keys.txt") << "acme sk-acme\nglobex sk-globex\n";
  auto [keyed, keyed_port] =
      start_api(model, {"--swarm", join(sw.list()), "--adapter", "*", "--api-key-file",
                        (m.dir.path() / "keys.txt").string(), "--adapter-tenants", "style=acme"});
  httplib::Client k("127.0.0.1", keyed_port);
  k.set_read_timeout(60, 0);
  const auto listed_for = [&](const std::string& key) {
    auto res = k.Get("/v1/models", {{"Authorization", "Bearer " + key}});
    REQUIRE(res);
    std::vector<std::string> ids;
    const json listing = json::parse(res->body);
    for (const json& e : listing["data"]) ids.push_back(e["id"]);
    return ids;
  };
  CHECK(listed_for("sk-acme") == std::vector<std::string>{m.dir.path().filename().string(), "style"});
  CHECK(listed_for("sk-globex") == std::vector<std::string>{m.dir.path().filename().string()});
  auto refused = k.Post("/v1/completions", {{"Authorization", "Bearer sk-globex"}}, adapted.dump(), "application/json");
  REQUIRE(refused);
  CHECK(refused->status == 404);
  // The 404 of a name nobody serves, listing what globex may use.
  CHECK(json::parse(refused->body)["error"]["message"] == "The model 'style' does not exist; this server serves '" +
                                                               m.dir.path().filename().string() + "' (GET /v1/models).");
  auto allowed = k.Post("/v1/completions", {{"Authorization", "Bearer sk-acme"}}, adapted.dump(), "application/json");
  REQUIRE(allowed);
  REQUIRE_MESSAGE(allowed->status == 200, allowed->body);
  CHECK(json::parse(allowed->body)["choices"][0]["text"] == local_style.out.substr(0, local_style.out.size() - 1));
  keyed.signal(SIGTERM);
  CHECK(keyed.wait(10s) == 0);
}

TEST_CASE("corolla api --local serves, and bad flags are one error line") {
  testing::temp_dir_guard dir("api-cli");
  api::write_chat_model(dir.path());
  const std::string model = dir.path().string();
  // Isolated: the same chat twice, and the second continues no cache (it
  // would continue the first's otherwise: tests/api/test_http_api.cpp).
  // The metrics also on a listener of their own, named on the line.
  // And a LoRA adapter served beside the base model (--adapter NAME=DIR).
  const auto style = dir.path() / "style";
  testing::random_lora(transformer::load(dir.path(), cpu_backend()).config(), 3, 0.4f).save(style, model);
  auto [api, port] = start_api(model, {"--local", "--api-key", "k", "--isolate-requests", "--metrics-listen",
                                       "127.0.0.1:0", "--adapter", "style=" + style.string()});
  std::string ready;  // the readiness line
  for (const std::string& l : api.lines())
    if (l.find(" listening on ") != std::string::npos) ready = l;
  std::smatch metrics_at;
  REQUIRE_MESSAGE(std::regex_search(ready, metrics_at, std::regex(R"( metrics http://127\.0\.0\.1:(\d+))")), ready);
  httplib::Client c("127.0.0.1", port);
  for (int turn = 0; turn < 2; ++turn) {
    auto res = c.Post("/v1/chat/completions", {{"Authorization", "Bearer k"}},
                      json{{"model", dir.path().filename().string()},
                           {"messages", {{{"role", "user"}, {"content", "the cat"}}}},
                           {"max_tokens", 4}}
                          .dump(),
                      "application/json");
    REQUIRE(res);
    CHECK(res->status == 200);
    const json r = json::parse(res->body);
    CHECK(r["choices"][0]["message"]["role"] == "assistant");
    CHECK(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  }
  {
    auto listed = c.Get("/v1/models", {{"Authorization", "Bearer k"}});
    REQUIRE(listed);
    const json data = json::parse(listed->body)["data"];
    REQUIRE(data.size() == 2u);
    CHECK(data[1]["id"] == "style");
    CHECK(data[1]["parent"] == dir.path().filename().string());
    auto res = c.Post("/v1/completions", {{"Authorization", "Bearer k"}},
                      json{{"model", "style"}, {"prompt", "the cat"}, {"max_tokens", 4}, {"temperature", 0}}.dump(),
                      "application/json");
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(json::parse(res->body)["model"] == "style");
    // What generate --adapter prints (merged as the weights load), and what
    // another api with the adapter merged (--merge-adapter) answers for the
    // model id.
    const auto local = testing::run_corolla(
        {"generate", "--model", model, "--prompt", "the cat", "--max-new-tokens", "4", "--adapter", style.string()}, 60s);
    REQUIRE_MESSAGE(local.exit_code == 0, local.err);
    const std::string want = local.out.substr(0, local.out.size() - 1);  // its newline
    CHECK(json::parse(res->body)["choices"][0]["text"] == want);
    auto [merged, merged_port] = start_api(model, {"--local", "--merge-adapter", style.string()});
    httplib::Client mc("127.0.0.1", merged_port);
    auto mres = mc.Post("/v1/completions",
                        json{{"model", dir.path().filename().string()}, {"prompt", "the cat"}, {"max_tokens", 4},
                             {"temperature", 0}}
                            .dump(),
                        "application/json");
    REQUIRE(mres);
    CHECK(mres->status == 200);
    CHECK(json::parse(mres->body)["choices"][0]["text"] == want);
    merged.signal(SIGTERM);
    CHECK(merged.wait(10s) == 0);
  }
  httplib::Client m("127.0.0.1", std::stoi(metrics_at[1].str()));
  auto scraped = m.Get("/metrics");
  REQUIRE(scraped);
  CHECK(scraped->status == 200);
  CHECK(scraped->body.find("corolla_api_requests_total{endpoint=\"chat_completions\",status=\"200\"} 2") !=
        std::string::npos);
  api.signal(SIGTERM);
  CHECK(api.wait(10s) == 0);

  const auto error_of = [&](std::vector<std::string> args) {
    std::vector<std::string> all{"api", "--model", model};
    all.insert(all.end(), args.begin(), args.end());
    return testing::run_corolla(all, 30s);
  };
  testing::check_one_error(error_of({}), "give exactly one of --local");
  testing::check_one_error(error_of({"--local", "--swarm", "127.0.0.1:1"}), "give exactly one of --local");
  testing::check_one_error(error_of({"--local", "--listen", "nowhere"}), "--listen must be HOST:PORT");
  testing::check_one_error(error_of({"--local", "--chat-template", "vicuna"}), "'vicuna' is neither a known template");
  {
    const testing::process_result r = error_of({"--local", "--parallel", "0"});  // CLI11's usage error
    CHECK(r.exit_code == 105);
    CHECK(r.err.find("--parallel: must be a whole number in [1, 4096], got '0'") != std::string::npos);
  }
  std::ofstream(dir.path() / "keys.txt") << "acme sk-1\nglobex\n";
  testing::check_one_error(error_of({"--local", "--api-key-file", (dir.path() / "keys.txt").string()}),
                           "keys.txt:2: expected a tenant and a key, got 1 field");
  testing::check_one_error(error_of({"--local", "--api-key-file", (dir.path() / "none.txt").string()}),
                           "API key file " + (dir.path() / "none.txt").string() + " does not exist");
  {
    const testing::process_result r = error_of({"--local", "--api-key", "k", "--api-key-file", "f"});
    CHECK(r.exit_code == 108);  // CLI11's usage error
    CHECK(r.err.find("--api-key excludes --api-key-file") != std::string::npos);
  }
  {
    const testing::process_result r = error_of({"--local", "--request-read-timeout-s", "86401"});
    CHECK(r.exit_code == 105);
    CHECK(r.err.find("--request-read-timeout-s") != std::string::npos);
  }
  testing::check_one_error(error_of({"--swarm", "127.0.0.1:1", "--batching", "off"}), "--batching off is for --local");
  testing::check_one_error(error_of({"--local", "--batching", "off", "--adapter", style.string()}),
                           "--adapter serves adapters beside the base model in the batcher's batches");
  testing::check_one_error(error_of({"--local", "--adapter", dir.path().filename().string() + "=" + style.string()}),
                           "the name is the model's own id");
  testing::check_one_error(error_of({"--local", "--adapter", "x=" + (dir.path() / "none").string()}), "--adapter x=");
  testing::check_one_error(error_of({"--swarm", "127.0.0.1:1", "--adapter", "style=" + style.string()}),
                           "with --swarm give the NAME (or NAME@DIGEST) of an adapter the servers hold");
  testing::check_one_error(error_of({"--local", "--adapter", "*"}), "--adapter '*' (any adapter the swarm's servers "
                                                                    "hold) is for --swarm");
  testing::check_one_error(error_of({"--swarm", "127.0.0.1:1", "--merge-adapter", style.string()}),
                           "--merge-adapter is for --local");
  testing::check_one_error(error_of({"--local", "--batching", "off", "--prefix-sharing", "off"}),
                           "--prefix-sharing off is for --local with batching on");
  {
    const testing::process_result r = error_of({"--local", "--isolate-requests", "--prefix-sharing", "on"});
    CHECK(r.exit_code == 108);  // CLI11's usage error
    CHECK(r.err.find("--prefix-sharing excludes --isolate-requests") != std::string::npos);
  }
}

TEST_CASE("corolla api --api-key-file admits each tenant's keys, refuses others, and --adapter-tenants hides an adapter from the others") {
  testing::temp_dir_guard dir("api-keys");
  api::write_chat_model(dir.path());
  std::ofstream(dir.path() / "keys.txt") << "# tenant key\nacme sk-acme\nglobex sk-globex\n";
  const std::string keys = (dir.path() / "keys.txt").string();
  // An adapter private to acme: globex neither sees nor uses it.
  const auto style = dir.path() / "style";
  testing::random_lora(transformer::load(dir.path(), cpu_backend()).config(), 3, 0.4f).save(style, dir.path().string());
  const auto error_of = [&](std::vector<std::string> args) {
    std::vector<std::string> all{"api", "--model", dir.path().string(), "--local"};
    all.insert(all.end(), args.begin(), args.end());
    return testing::run_corolla(all, 30s);
  };
  testing::check_one_error(
      error_of({"--api-key", "k", "--adapter", "style=" + style.string(), "--adapter-tenants", "style=acme"}),
      "--adapter-tenants needs tenants: give --api-key-file");
  testing::check_one_error(
      error_of({"--api-key-file", keys, "--adapter", "style=" + style.string(), "--adapter-tenants", "styles=acme"}),
      "--adapter-tenants styles=...: no adapter 'styles' is served (these are: style)");
  testing::check_one_error(
      error_of({"--api-key-file", keys, "--adapter", "style=" + style.string(), "--adapter-tenants", "style=initech"}),
      "the tenant 'initech' holds no key in the --api-key-file");
  testing::check_one_error(error_of({"--api-key-file", keys, "--adapter-tenants", "style"}),
                           "--adapter-tenants style: expected NAME=TENANT[,TENANT...]");
  auto [api, port] = start_api(dir.path().string(), {"--local", "--api-key-file", keys, "--adapter",
                                                     "style=" + style.string(), "--adapter-tenants", "style=acme"});
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  for (const auto& [key, status] : {std::pair{std::string("sk-acme"), 200}, std::pair{std::string("sk-globex"), 200},
                                    std::pair{std::string("sk-other"), 401}, std::pair{std::string(), 401}}) {
    CAPTURE(key);
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    auto res = c.Get("/v1/models", h);
    REQUIRE(res);
    CHECK(res->status == status);
  }
  const auto complete = [&](const std::string& key) {
    auto res = c.Post("/v1/completions", {{"Authorization", "Bearer " + key}},
                      json{{"model", "style"}, {"prompt", "the cat"}, {"max_tokens", 2}}.dump(), "application/json");
    REQUIRE(res);
    return res->status;
  };
  const auto listed = [&](const std::string& key) {
    auto res = c.Get("/v1/models", {{"Authorization", "Bearer " + key}});
    REQUIRE(res);
    return json::parse(res->body)["data"].size();
  };
  CHECK(listed("sk-acme") == 2u);
  CHECK(complete("sk-acme") == 200);
  CHECK(listed("sk-globex") == 1u);
  CHECK(complete("sk-globex") == 404);
  api.signal(SIGTERM);
  CHECK(api.wait(10s) == 0);
}

TEST_CASE("corolla api exits within --shutdown-grace-s while a client trickles its headers") {
  testing::temp_dir_guard dir("api-grace");
  api::write_chat_model(dir.path());
  auto [api, port] = start_api(dir.path().string(), {"--local", "--shutdown-grace-s", "1"});
  api::header_trickle trickle(port, "/health");  // holds an HTTP thread
  std::this_thread::sleep_for(1s);
  api.signal(SIGTERM);
  const auto status = api.wait(60s);  // the trickle would hold it for 120 s
  trickle.stop();
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK(api.err().find("connections still open 1 s after SIGTERM; exiting without them") != std::string::npos);
}

TEST_CASE("corolla api --request-read-timeout-s: a request still arriving past it gets a 408 error object, counted") {
  testing::temp_dir_guard dir("api-read-limit");
  api::write_chat_model(dir.path());
  auto [api, port] = start_api(dir.path().string(), {"--local", "--request-read-timeout-s", "1"});
  const auto started = std::chrono::steady_clock::now();
  api::header_trickle trickle(port, "/v1/models");  // a header line every 500 ms
  const timeval limit{20, 0};
  ::setsockopt(trickle.fd(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string answer;
  char buf[4096];
  ssize_t got = 0;
  while ((got = ::recv(trickle.fd(), buf, sizeof buf, 0)) > 0) answer.append(buf, static_cast<std::size_t>(got));
  CHECK(std::chrono::steady_clock::now() - started >= 1s);
  CHECK(answer.rfind("HTTP/1.1 408 ", 0) == 0);
  const auto body = answer.find("\r\n\r\n");
  REQUIRE(body != std::string::npos);
  const json error = json::parse(answer.substr(body + 4));
  CHECK(error["error"]["message"] == "The request did not arrive within 1 s.");
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(20, 0);
  const auto scraped = c.Get("/metrics");
  REQUIRE(scraped);
  CHECK(scraped->body.find("corolla_api_requests_total{endpoint=\"models\",status=\"408\"} 1") != std::string::npos);
  api.signal(SIGTERM);
  CHECK(api.wait(10s) == 0);
}

TEST_CASE("corolla api --local --weights int8 holds only the int8 blocks and answers as corolla generate does") {
  testing::temp_dir_guard dir("api-int8");
  testing::tiny_model_options o;
  o.vocab = 128;
  o.max_positions = 128;
  o.sentencepiece_tokenizer = true;
  testing::write_tiny_model(dir.path(), o);
  const std::string model = dir.path().string();
  const std::string prompt = "the cat and the dog";
  const int max_tokens = 16;
  const auto local = testing::run_corolla({"generate", "--model", model, "--prompt", prompt, "--max-new-tokens",
                                           std::to_string(max_tokens), "--weights", "int8"},
                                          60s);
  REQUIRE_MESSAGE(local.exit_code == 0, local.err);
  REQUIRE(local.out.size() > 1);
  const std::string want = local.out.substr(0, local.out.size() - 1);  // generate ends the text with a newline

  auto [api, port] = start_api(model, {"--local", "--weights", "int8", "--parallel", "2"});
  // Loaded block by block as int8 (i8 in logs, as on the wire), its f32 parameters let go.
  INFO("api stderr: " << api.err());
  CHECK(api.err().find("api: " + std::to_string(o.layers) + " blocks loaded as i8 weights (f32 parameters not kept)") !=
        std::string::npos);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const json body = {{"model", dir.path().filename().string()},
                     {"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"temperature", 0}};
  for (int i = 0; i < 2; ++i) {  // either slot: the second generator reads the first's weights
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    REQUIRE(res);
    REQUIRE_MESSAGE(res->status == 200, res->body);
    CHECK(json::parse(res->body)["choices"][0]["text"] == want);
  }
  api.signal(SIGTERM);
  CHECK(api.wait(10s) == 0);
}

TEST_CASE("corolla bench api --local compares batched decoding with a generator per request") {
  testing::temp_dir_guard dir("api-bench-local");
  api::write_chat_model(dir.path());
  const auto r = testing::run_corolla({"bench", "api", "--local", "--model", dir.path().string(), "--clients", "1,3",
                                       "--new-tokens", "6", "--rounds", "2", "--device", "cpu", "--shared-prefix", "8",
                                       "--adapters", "2", "--adapter-rank", "4", "--json"},
                                      120s);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = testing::last_json_line(r.out);
  CHECK(j["bench"] == "api_local");
  CHECK(j["same_text"] == true);
  REQUIRE(j["levels"].size() == 2);
  for (const auto& level : j["levels"]) {
    CHECK(level["batched"]["failed"] == 0);
    CHECK(level["per_request"]["failed"] == 0);
    CHECK(level["batched"]["tokens_per_s"].get<double>() > 0);
    CHECK(level["per_request"]["tokens_per_s"].get<double>() > 0);
    CHECK(level["batched_to_per_request_tokens_per_s"].get<double>() > 0);
    // Every step went through a batch of at least one.
    CHECK(level["batched"]["mean_batch"].get<double>() >= 1.0);
    // With a shared prefix the batcher without shared pages runs too.
    CHECK(level["unshared"]["failed"] == 0);
    CHECK(level["batched_to_unshared_tokens_per_s"].get<double>() > 0);
    CHECK(level["unshared_to_batched_first_text_p50"].get<double>() > 0);
    // And isolated: no prompt token from another request's cache.
    CHECK(level["isolated"]["failed"] == 0);
    CHECK(level["batched_to_isolated_tokens_per_s"].get<double>() > 0);
    CHECK(level["isolated_to_batched_first_text_p50"].get<double>() > 0);
    CHECK(level["isolated"]["cached_prompt_tokens"] == 0);
    // And a cache_salt per client.
    CHECK(level["salted"]["failed"] == 0);
    CHECK(level["batched_to_salted_tokens_per_s"].get<double>() > 0);
    CHECK(level["salted_to_isolated_tokens_per_s"].get<double>() > 0);
    // And two adapters (zero B: the same text, same_text above).
    CHECK(level["adapters"]["failed"] == 0);
    CHECK(level["adapters_to_batched_tokens_per_s"].get<double>() > 0);
  }
  CHECK(j["adapters"] == 2);
  CHECK(j["levels"][0]["batched"]["mean_batch"].get<double>() == 1.0);  // one client: batches of one
  // The second round's prompt continues from the first's cache: at least
  // the 8 shared tokens were not computed again.
  CHECK(j["levels"][0]["batched"]["cached_prompt_tokens"].get<int>() >= 8);
  // So does a client's under its own salt.
  CHECK(j["levels"][0]["salted"]["cached_prompt_tokens"].get<int>() >= 8);
  CHECK(j["shared_prefix"] == 8);
}

TEST_CASE("corolla bench api runs every part on a tiny model and finds the same text both ways") {
  testing::temp_dir_guard dir("api-bench");
  api::write_chat_model(dir.path());
  const auto r = testing::run_corolla({"bench", "api", "--model", dir.path().string(), "--clients", "1,3",
                                       "--new-tokens", "4", "--rounds", "2", "--shared-prefix", "16", "--turns", "3",
                                       "--json"},
                                      120s);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = testing::last_json_line(r.out);
  CHECK(j["bench"] == "api");
  CHECK(j["same_text"] == true);
  REQUIRE(j["levels"].size() == 2);
  for (const auto& level : j["levels"]) {
    CHECK(level["http"]["failed"] == 0);
    CHECK(level["direct"]["failed"] == 0);
    CHECK(level["http"]["tokens_per_s"].get<double>() > 0);
    CHECK(level["http"]["ttft_p50_ms"].get<double>() > 0);
    // The engine without shared pages ran too (same_text covers its text).
    CHECK(level["unshared"]["failed"] == 0);
    CHECK(level["direct_to_unshared_tokens_per_s"].get<double>() > 0);
    CHECK(level["shared_prompt_tokens"].get<int>() >= 0);
    // Conversations of 3 turns on both engines: the same replies (greedy),
    // the later turns timed.
    CHECK(level["chat"]["turns"] == 3);
    CHECK(level["chat"]["same_text"] == true);
    CHECK(level["chat"]["kept"]["failed"] == 0);
    CHECK(level["chat"]["unshared"]["ttft_p50_ms"].get<double>() > 0);
    CHECK(level["chat"]["kept_to_unshared_tokens_per_s"].get<double>() > 0);
  }
  // One conversation: turns 2 and 3 each start on the last turn's parked
  // sessions (its system prompt, prompt and reply at least).
  CHECK(j["levels"][0]["chat"]["shared_prompt_tokens"].get<int>() >= 2 * (16 + 16 + 3));
  // One client at a time still shares: finished requests' sessions are
  // kept (parked) and the next prompt starts on the system prompt's pages.
  CHECK(j["levels"][0]["shared_prompt_tokens"].get<int>() >= 16);
  CHECK(j["levels"][1]["clients"] == 3);
  CHECK(j["shared_prefix"] == 16);
}
