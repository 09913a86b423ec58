// apps/commands.hpp — how subcommands plug into the corolla CLI.
//
// Each apps/<command>.cpp defines one register_<command>() that adds its
// subcommand to the CLI11 app and sets `action` (run after parsing) when the
// subcommand is chosen. The action returns the process exit code. Errors at
// this edge are exceptions; run_cli turns them into one line on stderr.
#pragma once

#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace corolla::app {

using action_fn = std::function<int()>;

int run_cli(int argc, char** argv);

void register_info(CLI::App& app, action_fn& action);

/// Applies --threads (0 = all cores) and --log-level to the process.
void apply_common_options(int threads, const std::string& log_level);

}  // namespace corolla::app
