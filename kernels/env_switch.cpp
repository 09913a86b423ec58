#include "kernels/env_switch.hpp"

#include <cstdlib>

#include <spdlog/spdlog.h>

namespace corolla {

std::optional<bool> parse_switch(std::string_view text) {
  for (std::string_view on : {"1", "on", "true", "yes"})
    if (text == on) return true;
  for (std::string_view off : {"0", "off", "false", "no"})
    if (text == off) return false;
  return std::nullopt;
}

bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  if (const std::optional<bool> on = parse_switch(v)) return *on;
  spdlog::error("{}={}: not a switch (1, on, true or yes to turn it on; 0, off, false or no to turn it off); "
                "it stays {}",
                name, v, fallback ? "on" : "off");
  return fallback;
}

}  // namespace corolla
