// kernels/env_switch.hpp — an on/off switch read from the environment, for
// the settings that turn a code path off to measure it or to rule it out
// (COROLLA_CUDA_GRAPHS, COROLLA_CUDA_EARLY_LAUNCH, COROLLA_LINK_GATE, ...;
// docs/cuda.md lists them). One parser for all of them, so every switch
// takes the same words, and a misspelt value is reported instead of
// silently meaning the default. (Reported, not thrown: switches are read
// where an op or an actor first needs them, where an exception would end
// the op or the actor rather than the command.)
#pragma once

#include <optional>
#include <string_view>

namespace corolla {

/// The value of switch text `text`: true for 1, on, true or yes; false for
/// 0, off, false or no (lower case); nothing for anything else.
std::optional<bool> parse_switch(std::string_view text);

/// The switch `name` in the environment: `fallback` when it is unset or
/// empty, else parse_switch of its value; anything else is `fallback` too,
/// after an error through spdlog's default logger (stderr in the corolla
/// binary) naming the variable, its value, the accepted words and the
/// setting used.
bool env_switch(const char* name, bool fallback);

}  // namespace corolla
