// apps/control_token_env.hpp — a fresh random control token for the
// processes a local harness (faultlab) starts: set in this process's
// environment (COROLLA_CONTROL_TOKEN) while it lives, so the children
// inherit it; their nodes (apps/node_flags.cpp, train's rank nodes) obey
// control.reshape with it and nothing else.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <random>
#include <string>

namespace corolla::app {

/// The control token this process was started with ("" = none): a node
/// given it publishes its control actor (node_options::control_token).
inline std::string inherited_control_token() {
  const char* token = std::getenv("COROLLA_CONTROL_TOKEN");
  return token ? token : "";
}

class control_token_env {
 public:
  control_token_env() {
    std::random_device rd;
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; ++i) token_ += hex[rd() % 16];
    ::setenv("COROLLA_CONTROL_TOKEN", token_.c_str(), 1);
  }
  ~control_token_env() { ::unsetenv("COROLLA_CONTROL_TOKEN"); }
  control_token_env(const control_token_env&) = delete;
  control_token_env& operator=(const control_token_env&) = delete;
  const std::string& token() const { return token_; }

 private:
  std::string token_;
};

}  // namespace corolla::app
