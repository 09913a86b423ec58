// tests/kernels/env_switch.cpp — the one parser of the on/off settings in
// the environment (kernels/env_switch.hpp): the COROLLA_CUDA_* switches,
// COROLLA_LINK_GATE. The switches themselves act only on a GPU or a link;
// what they accept, and what a misspelt value does, is checked here.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "kernels/env_switch.hpp"

using namespace corolla;

namespace {

constexpr const char* variable = "COROLLA_TEST_ENV_SWITCH";

/// Sets `variable` (unset for nullptr) for one scope, and captures what
/// spdlog's default logger writes meanwhile.
struct switch_scope {
  std::ostringstream log;
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();

  explicit switch_scope(const char* value) {
    if (value)
      ::setenv(variable, value, 1);
    else
      ::unsetenv(variable);
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("env-switch-test", sink));
  }
  ~switch_scope() {
    spdlog::set_default_logger(previous);
    ::unsetenv(variable);
  }
};

}  // namespace

TEST_CASE("switch words: 1, on, true, yes turn a switch on, and 0, off, false, no turn it off: nothing else does") {
  for (const char* on : {"1", "on", "true", "yes"}) CHECK(parse_switch(on) == std::optional<bool>(true));
  for (const char* off : {"0", "off", "false", "no"}) CHECK(parse_switch(off) == std::optional<bool>(false));
  for (const char* other : {"", "2", "enable", "ON", " 1", "1 ", "onn", "n"}) {
    INFO("'" << other << "'");
    CHECK_FALSE(parse_switch(other).has_value());
  }
}

TEST_CASE("an environment switch: its default when unset or empty, its word's setting, and a misspelt value reported") {
  for (const bool fallback : {false, true}) {
    {
      switch_scope unset(nullptr);
      CHECK(env_switch(variable, fallback) == fallback);
      CHECK(unset.log.str().empty());
    }
    {
      switch_scope empty("");
      CHECK(env_switch(variable, fallback) == fallback);
      CHECK(empty.log.str().empty());
    }
    {
      switch_scope on("on");
      CHECK(env_switch(variable, fallback));
      CHECK(on.log.str().empty());
    }
    {
      switch_scope off("0");
      CHECK_FALSE(env_switch(variable, fallback));
      CHECK(off.log.str().empty());
    }
    {
      // Before, COROLLA_CUDA_SYNC and COROLLA_LINK_GATE took any value but
      // "0" as on: "off" left both on.
      switch_scope misspelt("enable");
      CHECK(env_switch(variable, fallback) == fallback);
      const std::string said = misspelt.log.str();
      INFO(said);
      CHECK(said.find("COROLLA_TEST_ENV_SWITCH=enable: not a switch") != std::string::npos);
      CHECK(said.find(fallback ? "it stays on" : "it stays off") != std::string::npos);
    }
  }
}
