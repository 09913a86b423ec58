// apps/flag_checks.cpp — see flag_checks.hpp.
#include "apps/flag_checks.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "net/shaping.hpp"

namespace corolla::app {
namespace {

/// "0", "0.5", "1e+06": a bound as a person writes it.
std::string plain(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

/// A validator of `rule` ("a finite number >= 0"), shown in --help as
/// `help` ("NUMBER >= 0"): `fits` says whether a finite value satisfies it.
CLI::Validator finite_number(const std::string& rule, const std::string& help, std::function<bool(double)> fits) {
  return CLI::Validator(
      [rule, fits](std::string& text) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(v) || !fits(v))
          return "must be " + rule + ", got '" + text + "'";
        return {};
      },
      help);
}

/// `text` read whole as a T; nothing when it is not one (or out of T's range).
template <typename T>
std::optional<T> whole(const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (text.empty() || r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator integer_between(long long low, long long high) {
  const std::string range = "[" + std::to_string(low) + ", " + std::to_string(high) + "]";
  return CLI::Validator(
      [low, high, range](std::string& text) -> std::string {
        const auto v = whole<long long>(text);
        if (!v || *v < low || *v > high) return "must be a whole number in " + range + ", got '" + text + "'";
        return {};
      },
      "INT in " + range);
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (!whole<std::uint64_t>(text)) return "must be a whole number from 0 to 18446744073709551615, got '" + text + "'";
        return {};
      },
      "UINT");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must not be empty" : std::string(); }, "");
}

CLI::Validator finite_at_least(double low) {
  return finite_number("a finite number >= " + plain(low), "NUMBER >= " + plain(low),
                       [low](double v) { return v >= low; });
}

CLI::Validator finite_above(double low) {
  return finite_number("a finite number > " + plain(low), "NUMBER > " + plain(low),
                       [low](double v) { return v > low; });
}

CLI::Validator finite_between(double low, double high) {
  return finite_number("a finite number in [" + plain(low) + ", " + plain(high) + "]",
                       "NUMBER in [" + plain(low) + " - " + plain(high) + "]",
                       [low, high](double v) { return v >= low && v <= high; });
}

CLI::Validator link_profile() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          net::parse_link_profile(text);
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        return {};
      },
      "PROFILE");
}

}  // namespace corolla::app
