// apps/number_checks.hpp — CLI11 validators for numeric flags that refuse
// NaN and say their bounds plainly. CLI11's Range lets "nan" through (every
// comparison with NaN is false), and PositiveNumber / NonNegativeNumber
// print DBL_MAX as three hundred digits in their message.
#pragma once

#include <CLI/CLI.hpp>

namespace corolla::app {

/// A finite number >= `low` ("--relay-rate: must be a finite number >= 0, got nan").
CLI::Validator finite_at_least(double low);
/// A finite number > `low`.
CLI::Validator finite_above(double low);
/// A finite number in [low, high].
CLI::Validator finite_between(double low, double high);

}  // namespace corolla::app
