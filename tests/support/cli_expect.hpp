// tests/support/cli_expect.hpp — the CLI's promise for bad input, as a check:
// the process exits by itself with status 1 and writes exactly one line,
// "corolla: error: ...", naming the problem; and the JSON line a command
// ends its output with.
#pragma once

#include <sstream>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"

namespace corolla::testing {

/// Checks that `r` ended with one error line containing `expected_part`.
inline void check_one_error(const process_result& r, const std::string& expected_part) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exited());
  CHECK(r.exit_code == 1);
  const auto lines = r.err_lines();
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].rfind("corolla: error: ", 0) == 0);
  CHECK(lines[0].find(expected_part) != std::string::npos);
}

/// The last non-empty line of `out`, parsed as JSON (the benches end with one).
inline nlohmann::json last_json_line(const std::string& out) {
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}

}  // namespace corolla::testing
