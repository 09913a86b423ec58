// tests/api/prometheus_text.hpp — a strict reader of Prometheus' text
// exposition format (0.0.4) for the tests: every line must be a # HELP, a
// # TYPE (once per family, before its samples) or a sample
// `name{label="value",...} number`; returns the samples by their text
// before the value. Throws std::runtime_error naming the first bad line.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

namespace corolla::api {

inline std::map<std::string, double> parse_prometheus_text(const std::string& text) {
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? ([-+]?(?:[0-9.eE+-]+|Inf|NaN))$)");
  std::map<std::string, double> out;
  std::set<std::string> typed;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    const auto bad = [&](const std::string& why) {
      throw std::runtime_error("metrics line " + std::to_string(n) + " '" + line + "': " + why);
    };
    if (std::regex_match(line, m, help)) continue;
    if (std::regex_match(line, m, type)) {
      if (!typed.insert(m[1]).second) bad("a second TYPE for the family");
      continue;
    }
    if (!std::regex_match(line, m, sample)) bad("not a sample, HELP or TYPE line");
    std::string family = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!typed.count(family) && family.size() > std::string(suffix).size() &&
          family.compare(family.size() - std::string(suffix).size(), std::string::npos, suffix) == 0)
        family.resize(family.size() - std::string(suffix).size());
    if (!typed.count(family)) bad("sample before its family's TYPE");
    const std::string key = std::string(m[1]) + std::string(m[2]);
    if (out.count(key)) bad("a duplicate series");
    const std::string v = m[3];
    out[key] = v == "+Inf" || v == "Inf" ? HUGE_VAL : v == "-Inf" ? -HUGE_VAL : std::strtod(v.c_str(), nullptr);
  }
  return out;
}

}  // namespace corolla::api
