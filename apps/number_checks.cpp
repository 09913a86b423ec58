// apps/number_checks.cpp — see number_checks.hpp.
#include "apps/number_checks.hpp"

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

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

}  // namespace

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

}  // namespace corolla::app
