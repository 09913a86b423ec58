// The swarm dashboard in a real headless browser: three `corolla serve`
// processes in one DHT, `corolla dashboard` reading it, and Debian's
// chromium driven by playwright-core (tests/web/dashboard_check.mjs). The
// page must draw every server with its span and drop the one killed, without
// a reload. The browser tools are part of the test set-up (scripts/setup.sh
// installs chromium and runs `npm ci` in tests/web); missing, the test fails
// saying what to install, unless COROLLA_SKIP_BROWSER_TESTS=1.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/random_lora.hpp"
#include "tests/support/process.hpp"

using namespace corolla;
using namespace corolla::swarm_test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// Why the browser test cannot run here ("" when it can).
std::string missing_browser_tools(const fs::path& web) {
  const char* chromium = std::getenv("COROLLA_CHROMIUM");
  if (!fs::exists(chromium ? chromium : "/usr/bin/chromium")) return "chromium (apt-get install chromium)";
  if (!fs::exists("/usr/bin/node")) return "node (apt-get install nodejs)";
  if (!fs::exists(web / "node_modules" / "playwright-core")) return "playwright-core (cd tests/web && npm ci)";
  return "";
}

}  // namespace

TEST_CASE("the dashboard page in headless chromium shows every server's span and drops a killed one") {
  const fs::path web = fs::path(COROLLA_SOURCE_DIR) / "tests" / "web";
  if (const std::string missing = missing_browser_tools(web); !missing.empty()) {
    const char* skip = std::getenv("COROLLA_SKIP_BROWSER_TESTS");
    if (skip && std::string(skip) == "1") {
      MESSAGE("skipped: no " << missing);
      return;
    }
    FAIL("the browser test needs " << missing << " (or set COROLLA_SKIP_BROWSER_TESTS=1)");
  }
  swarm_model m(architecture::llama);
  // gamma holds two adapters: its record names them, and its row shows them.
  testing::temp_dir_guard adapters("dashboard-adapters");
  testing::random_lora(m.cfg, 8, 0.3f).save(adapters / "style", m.dir.path().string());
  testing::random_lora(m.cfg, 9, 0.3f).save(adapters / "other", m.dir.path().string());
  swarm_processes s;
  // Records live 2 s without a refresh, so a killed server's expires soon.
  s.start(m, "alpha", 0, 2, {"--dht", "--dht-ttl-s", "2"});
  const std::string dht = s.dht["alpha"];
  REQUIRE(!dht.empty());
  s.start(m, "beta", 2, 4, {"--initial-peers", dht, "--dht-ttl-s", "2"});
  s.start(m, "gamma", 0, 4,
          {"--initial-peers", dht, "--dht-ttl-s", "2", "--adapter", "style=" + (adapters / "style").string(),
           "--adapter", "other=" + (adapters / "other").string()});

  child_process dash = child_process::corolla(
      {"dashboard", "--swarm-dht", dht, "--model", m.dir.path().string(), "--listen", "127.0.0.1:0"});
  auto line = dash.wait_line(std::regex(R"(corolla dashboard (\S+) listening on (http://127\.0\.0\.1:\d+))"), 30s);
  REQUIRE_MESSAGE(line, "corolla dashboard printed no readiness line; stderr:\n" << dash.err());
  const std::string url = (*line)[2].str();

  const json spans = {{"alpha", "0:2"}, {"beta", "2:4"}, {"gamma", "0:4"}};
  const testing::process_result r = testing::run_process(
      "/usr/bin/node",
      {(web / "dashboard_check.mjs").string(), url, spans.dump(), "beta", std::to_string(s.procs.at("beta").pid())},
      std::chrono::seconds(120));
  INFO("browser check stdout:\n" << r.out << "\nstderr:\n" << r.err << "\ndashboard stderr:\n" << dash.err());
  REQUIRE(r.exit_code == 0);
  json rendered, after;
  for (const std::string& l : r.out_lines()) {
    const json j = json::parse(l, nullptr, false);
    if (!j.is_object()) continue;
    if (j.value("phase", "") == "rendered") rendered = j;
    if (j.value("phase", "") == "after_kill") after = j;
  }
  REQUIRE(rendered.is_object());
  REQUIRE(after.is_object());
  CHECK(rendered["servers"].size() == 3u);
  CHECK(rendered["rows"].size() == 3u);
  CHECK(rendered["coverage"] == json::array({2, 2, 2, 2}));
  CHECK(rendered["status"] == "every block served");
  CHECK(rendered["adapters"]["gamma"] == "other, style");  // in name order, without their digests
  CHECK(rendered["adapters"]["alpha"] == "–");
  CHECK(after["servers"].size() == 2u);
  for (const json& sv : after["servers"]) CHECK(sv["node"] != "beta");
  CHECK(after["coverage"] == json::array({2, 2, 1, 1}));
  CHECK(after["events"][0].get<std::string>().find("vanished beta") != std::string::npos);
}
