// `corolla api` driven by the official OpenAI Node SDK (tests/web/
// openai_check.mjs, npm's `openai`): the SDK lists the model and a LoRA
// adapter served beside it (`--adapter NAME=DIR`), its completions (plain
// and streamed) and a streamed chat with the adapter answer what the
// server answers a plain HTTP client, and an unknown model is the SDK's
// NotFoundError. The SDK is part of the test set-up (scripts/setup.sh runs
// `npm ci` in tests/web); missing, the test fails saying what to install,
// unless COROLLA_SKIP_BROWSER_TESTS=1 (as the other Node tests).
#include <doctest/doctest.h>

#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/transformer.hpp"
#include "tests/api/api_test_util.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/random_lora.hpp"

using namespace corolla;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace fs = std::filesystem;

TEST_CASE("the official OpenAI SDK lists, completes, streams and chats with a served adapter as plain HTTP does") {
  const fs::path web = fs::path(COROLLA_SOURCE_DIR) / "tests" / "web";
  const std::string missing = !fs::exists("/usr/bin/node")                         ? "node (apt-get install nodejs)"
                              : !fs::exists(web / "node_modules" / "openai") ? "openai (cd tests/web && npm ci)"
                                                                                  : "";
  if (!missing.empty()) {
    const char* skip = std::getenv("COROLLA_SKIP_BROWSER_TESTS");
    if (skip && std::string(skip) == "1") {
      MESSAGE("skipped: no " << missing);
      return;
    }
    FAIL("the SDK test needs " << missing << " (or set COROLLA_SKIP_BROWSER_TESTS=1)");
  }
  testing::temp_dir_guard dir("api-openai-sdk");
  api::write_chat_model(dir.path());
  const std::string model_id = dir.path().filename().string();
  const auto style = dir.path() / "style";
  testing::random_lora(transformer::load(dir.path(), cpu_backend()).config(), 5, 0.4f)
      .save(style, dir.path().string());
  testing::child_process api = testing::child_process::corolla(
      {"api", "--model", dir.path().string(), "--local", "--listen", "127.0.0.1:0", "--api-key", "sk-test",
       "--threads", "1", "--adapter", "style=" + style.string()});
  auto line = api.wait_line(std::regex(R"(listening on http://127\.0\.0\.1:(\d+) adapters style)"), 30s);
  REQUIRE_MESSAGE(line, "corolla api printed no readiness line naming the adapter; stderr:\n" << api.err());
  const int port = std::stoi((*line)[1].str());
  const std::string prompt = "the cat sat";

  // What the server answers a plain HTTP client.
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const httplib::Headers auth{{"Authorization", "Bearer sk-test"}};
  const auto answer = [&](const std::string& path, const json& body) {
    auto res = c.Post(path, auth, body.dump(), "application/json");
    REQUIRE(res);
    REQUIRE_MESSAGE(res->status == 200, res->body);
    return json::parse(res->body);
  };
  const json completion = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
  json base_body = completion, adapted_body = completion;
  base_body["model"] = model_id;
  adapted_body["model"] = "style";
  const std::string base_text = answer("/v1/completions", base_body)["choices"][0]["text"];
  const std::string adapted_text = answer("/v1/completions", adapted_body)["choices"][0]["text"];
  REQUIRE(base_text != adapted_text);
  const std::string chat_text = answer("/v1/chat/completions", {{"model", "style"},
                                                                 {"messages", {{{"role", "user"}, {"content", prompt}}}},
                                                                 {"max_tokens", 6},
                                                                 {"temperature", 0}})["choices"][0]["message"]["content"];

  const testing::process_result r = testing::run_process(
      "/usr/bin/node",
      {(web / "openai_check.mjs").string(), "http://127.0.0.1:" + std::to_string(port) + "/v1", "sk-test", model_id,
       "style", prompt},
      120s);
  INFO("SDK stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  json out;
  for (const std::string& l : r.out_lines())
    if (const json j = json::parse(l, nullptr, false); j.is_object()) out = j;
  REQUIRE(out.is_object());
  REQUIRE(out["models"].size() == 2u);
  CHECK(out["models"][0]["id"] == model_id);
  CHECK(out["models"][0]["parent"].is_null());
  CHECK(out["models"][1]["id"] == "style");
  CHECK(out["models"][1]["parent"] == model_id);
  CHECK(out["retrieved"] == "style");
  CHECK(out["base"]["model"] == model_id);
  CHECK(out["base"]["text"] == base_text);
  CHECK(out["adapted"]["model"] == "style");
  CHECK(out["adapted"]["text"] == adapted_text);
  CHECK(out["adapted"]["usage"]["completion_tokens"].get<int>() > 0);
  CHECK(out["streamed"] == adapted_text);
  CHECK(out["streamed_model"] == "style");
  CHECK(out["chat"] == chat_text);
  CHECK(out["unknown"]["status"] == 404);
  CHECK(out["unknown"]["code"] == "model_not_found");
  CHECK(out["unknown"]["is_not_found"] == true);
  api.signal(SIGTERM);
  CHECK(api.wait(10s) == 0);
}
