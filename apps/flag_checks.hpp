// apps/flag_checks.hpp — CLI11 validators for flag values that CLI11's own
// let through or describe badly: its Range lets "nan" through (every
// comparison with NaN is false), PositiveNumber / NonNegativeNumber print
// DBL_MAX as three hundred digits in their message, an unsigned option
// takes "-1" as its largest value, and an empty path reads as "not given".
#pragma once

#include <CLI/CLI.hpp>

namespace corolla::app {

/// A finite number >= `low` ("--relay-rate: must be a finite number >= 0, got nan").
CLI::Validator finite_at_least(double low);
/// A finite number > `low`.
CLI::Validator finite_above(double low);
/// A finite number in [low, high].
CLI::Validator finite_between(double low, double high);
/// A whole number in [low, high] ("--size: must be a whole number in
/// [1, 1073741824], got '-1'"). For unsigned flags too, which CLI11 would
/// otherwise take "-1" into as the largest value.
CLI::Validator integer_between(long long low, long long high);
/// A whole number >= 0 of up to 64 bits (a seed): "-1", which other tools
/// read as "random", is refused instead of wrapping to 2^64 - 1.
CLI::Validator unsigned_integer();
/// A non-empty value: `--save ""` would otherwise read as no --save, and
/// the work would not be written anywhere.
CLI::Validator non_empty();
/// A link profile (net/shaping.hpp syntax), checked when the flag is read:
/// "--wan-profiles: link profile: 'bogus': unknown profile ...", not after
/// the runs before the one that uses it.
CLI::Validator link_profile();

}  // namespace corolla::app
